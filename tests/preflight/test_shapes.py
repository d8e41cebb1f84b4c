"""Published shapes and the arithmetic on them (loop/preflight/shapes.py).

Run: python -m pytest tests/preflight/test_shapes.py
"""

from __future__ import annotations

import pytest

from loop.preflight.shapes import SHAPES, kv_bytes_per_token, parameter_count, shape_of


def test_parameter_counts_are_the_published_ones() -> None:
    """Qwen2.5's model cards: 0.49 B, 7.61 B, 32.5 B (0.5B ties its embeddings)."""
    billions = [parameter_count(SHAPES[f"Qwen/Qwen2.5-{n}-Instruct"]) / 1e9
                for n in ("0.5B", "7B", "32B")]  # fmt: skip
    assert billions == pytest.approx([0.494, 7.616, 32.76], rel=0.01)


def test_kv_bytes_per_token_by_hand() -> None:
    """7B: 2 x 28 layers x 4 KV heads x 128 x 2 bytes = 57,344 bytes."""
    assert kv_bytes_per_token(SHAPES["Qwen/Qwen2.5-7B-Instruct"]) == 57_344


def test_a_local_copy_is_found_by_its_folder_name_and_an_unknown_model_is_one_line() -> None:
    assert shape_of("/models/Qwen2.5-32B-Instruct") is SHAPES["Qwen/Qwen2.5-32B-Instruct"]
    with pytest.raises(ValueError, match="no published shape"):
        shape_of("gpt2")
