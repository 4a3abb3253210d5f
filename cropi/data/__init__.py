"""Prompt sets with verifiable answers: JSONL, plain Parquet and verl RLVR Parquet."""

from cropi.data.prompts import (BadRowsError, PromptFileError, PromptRecord, RowProblem, as_messages,
                                load_prompts, prompts_fingerprint, stable_prompt_id, write_jsonl,
                                write_parquet, write_verl_parquet)

__all__ = ["PromptRecord", "load_prompts", "prompts_fingerprint", "stable_prompt_id", "as_messages",
           "write_jsonl", "write_parquet", "write_verl_parquet", "BadRowsError", "PromptFileError",
           "RowProblem"]
