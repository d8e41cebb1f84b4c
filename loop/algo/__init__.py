"""The algorithm's math: advantages (LOO, GRPO, MT-GRPO turn credit, REINFORCE), GAE and the
dual-discount GAE, the policy and value losses, the preference pairs and the DMPO / DPO loss,
DPO-MCTS's tree (UCB, back-up, sibling pairs; pure Python, no torch), and credit assignment over
grouped rollouts. Pure functions, tensors in and out; nothing here imports from `loop` outside
`loop.algo` (tests/test_layout.py)."""
