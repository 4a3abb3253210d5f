"""Trajectory generation: K sampled responses per prompt with raw behavior log-probs.

Backends: ``"vllm"`` (vLLM offline engine, optional extra) and ``"hf"`` (transformers).
"""

from cropi.generation.base import (GenerationBackend, GenerationError, Sample, SamplingConfig, make_backend,
                                   prompt_seed)
from cropi.generation.prompting import check_prompt_fits, render_prompt

__all__ = ["GenerationBackend", "GenerationError", "Sample", "SamplingConfig", "check_prompt_fits",
           "make_backend", "prompt_seed", "render_prompt"]
