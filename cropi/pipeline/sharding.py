"""Stable assignment of prompts to N workers, by hash of the prompt id (not position),
so a worker's share does not change when the prompt file is reordered or extended."""

from __future__ import annotations

import hashlib
import re

from cropi.errors import InvalidInputError


def parse_shard(text: str | tuple[int, int] | None) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    if text is None:
        return (0, 1)
    if isinstance(text, tuple):
        i, n = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise InvalidInputError(f"shard {text!r} is not of the form I/N, for example 0/4")
        i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise InvalidInputError(f"shard {i}/{n}: need N >= 1 and 0 <= I < N")
    return i, n


def in_shard(prompt_id: str, shard: tuple[int, int]) -> bool:
    i, n = shard
    if n == 1:
        return True
    h = int.from_bytes(hashlib.blake2b(prompt_id.encode(), digest_size=8).digest(), "little")
    return h % n == i


def writer_id(shard: tuple[int, int]) -> str:
    return f"shard-{shard[0]:04d}-of-{shard[1]:04d}"
