"""Episodes and their concurrent collection: the ReAct agent loop, the token-exact trajectory
record, prompts and code blocks, the task sampler. No torch: importing `loop.rollout` loads
none, so environments and episodes run and test on any machine (tests/test_layout.py)."""
