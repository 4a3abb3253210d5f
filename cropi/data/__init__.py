"""Prompt sets with verifiable answers: JSONL, plain Parquet and verl RLVR Parquet.

The record type, ids and fingerprint are in ``records``; loading in ``readers``; writing in ``writers``.
"""

from cropi.data.readers import BadRowsError, PromptFileError, RowProblem, load_prompts, reading_once
from cropi.data.records import PromptRecord, as_messages, prompts_fingerprint, stable_prompt_id
from cropi.data.writers import write_jsonl, write_parquet, write_verl_parquet

__all__ = ["PromptRecord", "load_prompts", "prompts_fingerprint", "stable_prompt_id", "as_messages",
           "write_jsonl", "write_parquet", "write_verl_parquet", "BadRowsError", "PromptFileError",
           "RowProblem", "reading_once"]
