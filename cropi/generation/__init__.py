"""Trajectory generation: K sampled responses per prompt with raw behavior log-probs.

Backends: ``"vllm"`` (vLLM offline engine, optional extra) and ``"hf"`` (transformers),
started by name with ``make_backend`` (registry.py) under closed ``EngineOptions``.
"""

from cropi.generation.base import GenerationBackend, GenerationError, Sample, prompt_seed
from cropi.generation.options import CollectOptions, EngineOptions, SamplingConfig
from cropi.generation.prompting import check_prompt_fits, render_prompt
from cropi.generation.registry import make_backend

__all__ = ["CollectOptions", "EngineOptions", "GenerationBackend", "GenerationError", "Sample", "SamplingConfig",
           "check_prompt_fits", "make_backend", "prompt_seed", "render_prompt"]
