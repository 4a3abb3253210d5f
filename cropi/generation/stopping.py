"""Which token ids end a response: one definition shared by every backend."""

from __future__ import annotations

from pathlib import Path

from cropi.generation.base import GenerationError


def stop_token_ids(model_path: str | Path, tokenizer) -> set[int]:
    """EOS ids from ``generation_config.json`` and the tokenizer, as vLLM gathers them."""
    from transformers import GenerationConfig

    ids: set[int] = set()
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path, local_files_only=True).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        gen_eos = None
    for source in (gen_eos, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    if not ids:
        raise GenerationError(f"{model_path} names no end-of-sequence token (eos_token_id in "
                              "generation_config.json or the tokenizer): responses could never stop")
    return ids
