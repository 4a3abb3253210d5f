"""Prompt sets: the record type, loading, writing and fingerprinting in one place.

This is the import path the rest of cropi uses; the work is done in
``records`` (the model, ids, fingerprint), ``readers`` and ``writers``.
"""

from __future__ import annotations

from cropi.data.readers import BadRowsError, PromptFileError, RowProblem, load_prompts
from cropi.data.records import PromptRecord, as_messages, prompts_fingerprint, stable_prompt_id
from cropi.data.writers import write_jsonl, write_parquet, write_verl_parquet

__all__ = ["PromptRecord", "load_prompts", "prompts_fingerprint", "stable_prompt_id", "as_messages",
           "write_jsonl", "write_parquet", "write_verl_parquet", "BadRowsError", "PromptFileError",
           "RowProblem"]
