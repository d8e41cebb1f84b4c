"""Generation backends: `hf` (the training model itself), `vllm_server` (vLLM OpenAI servers)
and `openai` (any OpenAI-compatible endpoint), behind one async interface (`base.Generator`)."""

from loop.generators.base import FinishReason, Generation, Generator, GeneratorError, SamplingParams

__all__ = ["FinishReason", "Generation", "Generator", "GeneratorError", "SamplingParams"]
