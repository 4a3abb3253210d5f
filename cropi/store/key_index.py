"""Where each key of a sharded dataset lives: its part (a shard's record batch, or a whole
older shard) and its row there, in about 16 bytes a key.

Built from the keys sidecars (see shard_io), so building it reads no vectors. Keys are
held as 64-bit hashes sorted for binary search, not as strings: a million keys take 16 MB
rather than a dict's 150. The index only says where to look: a reader checks the key of
the row it finds in the verified part, so a stale or colliding hash can never serve
another key's row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Part:
    """Rows ``start .. start+rows`` of shard ``entry`` of writer ``writer``; ``batch`` None: the whole shard."""

    writer: str
    entry: dict
    batch: int | None
    start: int
    rows: int

    @property
    def key(self) -> tuple:
        """What identifies these verified bytes: a shard recommitted under the same name has another sha256."""
        sha = self.entry["sha256"] if self.batch is None else self.entry["batches"][self.batch][3]
        return (self.entry["file"], self.batch, sha)

    @property
    def nbytes(self) -> int:
        return self.entry["bytes"] if self.batch is None else self.entry["batches"][self.batch][1]


def parts_of(writer: str, entry: dict) -> list[Part]:
    """An entry's parts in row order: its batches when it records them, else the whole shard."""
    if "batches" not in entry:
        return [Part(writer, entry, None, 0, entry["rows"])]
    out, start = [], 0
    for i, (_, _, rows, _) in enumerate(entry["batches"]):
        out.append(Part(writer, entry, i, start, rows))
        start += rows
    return out


def key_hash(keys: list[str]) -> np.ndarray:
    """64-bit hashes of ``keys`` (Python's string hash: stable within this process, which is all an
    in-memory index needs)."""
    return np.fromiter((hash(k) for k in keys), dtype=np.int64, count=len(keys))


class KeyIndex:
    """Key -> (part, row in part), first occurrence winning, built shard by shard in read order."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._hash = np.empty(0, np.int64)
        self._part = np.empty(0, np.int32)
        self._row = np.empty(0, np.int32)

    def add(self, writer: str, entry: dict, keys: list[str]) -> None:
        """Record one shard's keys (in row order); call ``finish`` after the last."""
        first = len(self.parts)
        parts = parts_of(writer, entry)
        self.parts += parts
        part_of_row = np.repeat(np.arange(first, first + len(parts), dtype=np.int32), [p.rows for p in parts])
        row_in_part = np.arange(len(keys), dtype=np.int32) - np.repeat(
            np.array([p.start for p in parts], dtype=np.int32), [p.rows for p in parts])
        self._chunks.append((key_hash(keys), part_of_row, row_in_part))

    def finish(self) -> "KeyIndex":
        if self._chunks:
            hashes, parts, rows = (np.concatenate(c) for c in zip(*self._chunks))
            # np.unique's index is each value's first occurrence: the earliest shard wins, as in a full read
            self._hash, first = np.unique(hashes, return_index=True)
            self._part, self._row = parts[first], rows[first]
        self._chunks = []
        return self

    def __len__(self) -> int:
        return len(self._hash)

    def __contains__(self, key: str) -> bool:
        return self.locate(key) is not None

    def locate(self, key: str) -> tuple[int, int] | None:
        """(part number, row in that part) of ``key``, or None."""
        h = hash(key)
        i = int(np.searchsorted(self._hash, h))
        if i == len(self._hash) or self._hash[i] != h:
            return None
        return int(self._part[i]), int(self._row[i])

    @property
    def nbytes(self) -> int:
        return self._hash.nbytes + self._part.nbytes + self._row.nbytes
