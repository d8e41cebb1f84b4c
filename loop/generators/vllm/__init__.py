"""The `vllm_server` engine: vLLM OpenAI-compatible servers started (process.py, with their
launch environment and lifeline) or attached, routed by shared prefix (routing.py) and fed
versioned LoRA adapters (server.py).

Never imports loop.generators.hf (tests/test_layout.py)."""
