"""The `hf` engine: the training model itself samples (generator.py; its requests between the
event loop and the worker thread in requests.py, the model's listing and sampling mode in
listing.py), decoding many rows at once with their keys and values in one slot tensor
(engine.py, kvcache.py, attention.py), the projections packed for decoding (fused.py) and the
token draw (sampling.py).

Never imports loop.generators.vllm (tests/test_layout.py)."""
