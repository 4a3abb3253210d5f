"""Local models: tiny Qwen2 checkpoints built offline, and loading helpers."""

from cropi.models.loading import load_causal_lm, load_tokenizer
from cropi.models.tiny import build_tiny_model

__all__ = ["build_tiny_model", "load_causal_lm", "load_tokenizer"]
