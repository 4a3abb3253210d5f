"""Backends by name. The one module that knows every backend, so base.py knows none
(a backend imports base.py; base.py importing the backends was a circle)."""

from __future__ import annotations

from pydantic import ValidationError

from cropi.generation.base import GenerationBackend, GenerationError
from cropi.generation.options import EngineOptions


def make_backend(name: str, model_path, options: EngineOptions | None = None, **fields) -> GenerationBackend:
    """Start ``"vllm"`` (vLLM offline engine) or ``"hf"`` (transformers) on ``model_path``.

    Engine settings come as ``options`` or as its fields by keyword; either way they are
    validated by the closed ``EngineOptions`` schema before any engine starts.
    """
    if name not in ("hf", "vllm"):
        raise GenerationError(f"unknown generation backend {name!r}: use 'vllm' or 'hf'")
    try:
        options = EngineOptions.model_validate({**(options.model_dump() if options else {}), **fields})
        kwargs = options.for_backend(name)
    except (ValidationError, ValueError) as e:
        raise GenerationError(f"bad engine options for the {name!r} backend: {e}") from None
    if name == "hf":
        from cropi.generation.hf import HFBackend

        return HFBackend(model_path, **kwargs)
    from cropi.generation.vllm import VLLMBackend

    return VLLMBackend(model_path, **kwargs)
