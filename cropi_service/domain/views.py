"""In-memory views of stored results, built once per stored version and served many times.

``RankingView``: the ranked prompts in fused order (and, on demand, in each validation set's
order), sliced into pages without touching the store. ``GradientView``: a split's gradients
looked up by prompt id (read a record batch at a time from the store) with per-prompt metadata
(ESS and ESS/K included), rendered as JSON records or an Arrow IPC stream.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cropi.contracts import GRADIENT_META_COLUMNS, GRADIENT_OPTIONAL_COLUMNS, SCORE_PREFIX
from cropi.errors import InvalidInputError
from cropi.pipeline.rank import RankingResult

from .cache import ByteLRU, NotLoaded
from ..base.errors import UnknownIdError

FUSED = "fused"
# Ranking rows are encoded a block at a time, on first use; a block of this many rows is a whole order
# up to a million prompts (about 165 MB and 2 s with orjson at 950k rows). Smaller blocks spread the
# encoding over the requests that meet them: under the serving benchmark's random-offset load over three
# 1M-prompt checkpoints that put every cold block inside the measured window (p99 0.35 s with 1,024-row
# blocks, 5.5 s with 65,536: service_1m_blocks_1024.json, service_1m_blocks_65536.json), where encoding
# an order at its first request leaves the load warm.
PAGE_BLOCK_ROWS = 1 << 20
ENCODE_ROWS = 65536  # rows turned into Python objects at once while encoding a block
DEFAULT_PAGE_CACHE_BYTES = 256 << 20  # a view built without the service's shared cache: a 1M-row order fits
ARROW_STREAM = "application/vnd.apache.arrow.stream"


def _finite(x: Any) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return float(x) if x is not None and math.isfinite(x) else None


_F16_TEXT: np.ndarray | None = None
_F16_BYTES: pa.Array | None = None


def _float16_text() -> np.ndarray:
    """The exact decimal text of every float16 bit pattern (non-finite ones as null)."""
    global _F16_TEXT
    if _F16_TEXT is None:
        values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64).tolist()
        _F16_TEXT = np.array([repr(v) if math.isfinite(v) else "null" for v in values], dtype=object)
    return _F16_TEXT


def _float16_bytes() -> pa.Array:
    """``_float16_text()`` with a comma after each, as an Arrow binary array indexed by bit pattern."""
    global _F16_BYTES
    if _F16_BYTES is None:
        _F16_BYTES = pa.array([t + "," for t in _float16_text().tolist()], pa.large_binary())
    return _F16_BYTES


def vector_json(vector: np.ndarray) -> str:
    """The numbers of ``vector``, comma-separated, exact (float16 via a table: 10x faster than repr)."""
    if vector.dtype == np.float16:
        # .tolist() first: str.join over a list is faster than over the array's iterator
        return ",".join(_float16_text()[np.ascontiguousarray(vector).view(np.uint16)].tolist())
    return ",".join(repr(v) if math.isfinite(v) else "null" for v in vector.astype(np.float64).tolist())


def vector_json_bytes(vector: np.ndarray) -> bytes:
    """``vector_json(vector)`` as bytes, made without an intermediate str for float16."""
    if vector.dtype == np.float16 and vector.size:
        # Arrow's take (C++) gathers the texts, commas included, into one data buffer: the text is that
        # buffer up to the last comma (about 3x faster than joining Python bytes objects)
        taken = _float16_bytes().take(pa.array(np.ascontiguousarray(vector).view(np.uint16)))
        offsets = np.frombuffer(taken.buffers()[1], np.int64)[taken.offset:taken.offset + len(taken) + 1]
        return memoryview(taken.buffers()[2])[offsets[0]:offsets[-1] - 1].tobytes()
    return vector_json(vector).encode()


def record_bytes_bound(dim: int, dtype: str, arrow: bool) -> int:
    """The most bytes one gradient record of ``dim`` values can take in a response, whatever its values
    (JSON: the longest text of a value; the metadata fields and prompt id at their longest)."""
    if arrow:
        return dim * np.dtype(dtype).itemsize + 2048
    return dim * ((_longest_float16_text() if dtype == "float16" else 24) + 1) + 2048


@functools.lru_cache(maxsize=None)
def _longest_float16_text() -> int:
    return max(len(t) for t in _float16_text().tolist())


def _pylist(values: Any) -> list:
    """Python scalars from a list, numpy array or Arrow array."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_pylist()
    return np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values)


class RankingView:
    """The ranked (non-excluded) prompts of one stored ranking, in rank order.

    Rows are encoded to JSON a block of ``PAGE_BLOCK_ROWS`` at a time, on first use, into
    ``blocks``: a byte-bounded LRU the service shares between views, so the memory of encoded
    pages is one setting (``ranking_cache_mb``) whatever the pool size and the number of
    checkpoints. A page is at most two block slices. Encoding a whole order at once, as before,
    made the first request of a 950k-row ranking wait 8 s and kept 162 MB an order for good,
    however many checkpoints were served.
    """

    def __init__(self, data: RankingResult, blocks: ByteLRU | None = None):
        table = data.table
        ranked = table.filter(pc.greater(table["rank"], 0))
        self.table = ranked.take(pc.sort_indices(ranked, [("rank", "ascending"), ("prompt_id", "ascending")]))
        self.validation = [c[len(SCORE_PREFIX):] for c in table.column_names if c.startswith(SCORE_PREFIX)]
        self.excluded = dict(data.excluded)
        self.meta = dict(data.meta)
        self.blocks = blocks if blocks is not None else ByteLRU(DEFAULT_PAGE_CACHE_BYTES)
        self._orders: dict[str, np.ndarray] = {}  # a validation set's order: row indices of ``table``
        self._lock = threading.Lock()
        self._block_locks: dict[tuple[str, int], threading.Lock] = {}
        self._token = object()  # block keys are this view's: a newer stored version never meets them

    @property
    def total(self) -> int:
        return self.table.num_rows

    @property
    def nbytes(self) -> int:
        """Memory of this view, as the service's cache of views counts it: the ranked table, and each
        validation set's order (8 bytes a row) counted from the start, sorted or not yet."""
        return self.table.nbytes + 8 * self.total * len(self.validation) + 4096

    def page_json(self, order: str, offset: int, limit: int, peek: bool = False) -> bytes:
        """Rows ``offset .. offset+limit`` of ``order``, as a JSON array of API records. With ``peek``,
        NotLoaded unless every block of the page is encoded already: never encodes nor waits on the
        lock (an encoding under way must not hold up the event loop)."""
        if order != FUSED and order not in self.validation:
            raise InvalidInputError(f"unknown validation set {order!r}; this ranking has {self.validation} "
                                    "(or leave `validation` out for the fused order)")
        first, end = min(offset, self.total), min(offset + limit, self.total)
        if first >= end:
            return b"[]"
        parts = []
        for b in range(first // PAGE_BLOCK_ROWS, (end - 1) // PAGE_BLOCK_ROWS + 1):
            base = b * PAGE_BLOCK_ROWS
            n = min(PAGE_BLOCK_ROWS, self.total - base)
            block = self.blocks.get((self._token, order, b))
            if block is None:
                if peek:
                    raise NotLoaded(order)
                block = self._load_block(order, b, base, n)
            lo, hi = max(first, base) - base, min(end, base + n) - base
            parts.append(memoryview(block.blob)[block.starts[lo]:block.starts[hi]])
        parts[-1] = parts[-1][:-1]  # each record is followed by a comma: not the page's last
        return b"".join((b"[", *parts, b"]"))

    def _load_block(self, order: str, b: int, base: int, n: int) -> "EncodedRows":
        """Encode block ``b`` once however many requests want it at the same moment: without this,
        50 clients meeting one cold block encoded it 50 times under one GIL (a 1M open loop measured
        p99 4.7 s with 65,536-row blocks, service_1m_blocks_uncoalesced.json)."""
        key = (self._token, order, b)
        with self._lock:
            lock = self._block_locks.setdefault((order, b), threading.Lock())
        with lock:
            block = self.blocks.get(key)  # another request may have encoded it meanwhile
            if block is None:
                block = self.blocks.put(key, self._encode_block(order, base, n))
        return block

    def _order(self, order: str) -> np.ndarray:
        """Row indices of ``table`` in a validation set's order: its score descending, ties by rank."""
        with self._lock:  # one sort per order, even under concurrent first requests
            if order not in self._orders:
                score = np.nan_to_num(self.table[SCORE_PREFIX + order].to_numpy(zero_copy_only=False)
                                      .astype(np.float64), nan=-np.inf)
                self._orders[order] = np.lexsort((self.table["rank"].to_numpy(), -score))
            return self._orders[order]

    def _encode_block(self, order: str, base: int, n: int) -> "EncodedRows":
        """Rows ``base .. base+n`` of ``order``: each row's JSON record followed by a comma, in one
        buffer, and where each starts. One buffer, not a bytes object a row: at a million rows the
        objects' headers and the list cost 40 MB an order."""
        blob, lengths = bytearray(), []
        # a slice at a time: the Python objects of a million rows at once would double the server's memory
        for start in range(base, base + n, ENCODE_ROWS):
            count = min(ENCODE_ROWS, base + n - start)
            rows = (self.table.slice(start, count) if order == FUSED
                    else self.table.take(self._order(order)[start:start + count]))
            cols = rows.to_pydict()
            selected = cols.get("selected")
            scores = [(v, cols[SCORE_PREFIX + v]) for v in self.validation]
            # orjson: 1.5 ms a 1,024 rows against json.dumps's 8.4 ms (measured at 950k rows)
            for i, pid in enumerate(cols["prompt_id"]):
                record = orjson.dumps({"position": start + i + 1, "prompt_id": pid, "rank": int(cols["rank"][i]),
                                       "fused": _finite(cols["fused"][i]),
                                       "scores": {v: _finite(s[i]) for v, s in scores},
                                       "selected": selected[i] if selected is not None else None}) + b","
                blob += record
                lengths.append(len(record))
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        return EncodedRows(bytes(blob), starts)  # exact size (a bytearray keeps up to an eighth more)


class EncodedRows:
    """A block of encoded ranking rows: ``blob`` and each row's start (and the end) in it. Its len()
    is its memory, as the byte-bounded cache counts it."""

    __slots__ = ("blob", "starts")

    def __init__(self, blob: bytes, starts: np.ndarray):
        self.blob, self.starts = blob, starts

    def __len__(self) -> int:
        return len(self.blob) + self.starts.nbytes


class GradientView:
    """One split's stored gradients, looked up by prompt id.

    ``data`` is a ``cropi.store.SplitReader`` (the real store: a key index in memory, vectors read a
    record batch at a time through the process's bounded part cache) or an in-memory table (tests'
    fakes). Rendered JSON records go to ``rendered``, an LRU the service shares between views (its
    budget bounds them all); keys carry this view's own token, so a view built for a newer stored
    version never serves an older one's records.
    """

    def __init__(self, data: Any, render_cache_bytes: int = 0, rendered: ByteLRU | None = None):
        self.source = data if hasattr(data, "take") else _TableSource(data)
        self.meta = {"checkpoint": data.checkpoint.name, "split": data.split, "spec_id": data.spec_id,
                     "fingerprint": getattr(data.checkpoint, "fingerprint", None)}
        self.dim = int(data.dim) if hasattr(data, "take") else int(self.source.vectors.shape[1])
        self.dtype = str(data.dtype) if hasattr(data, "take") else str(self.source.vectors.dtype)
        self.rendered = rendered if rendered is not None else ByteLRU(render_cache_bytes)
        self._token = object()

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.source

    @property
    def nbytes(self) -> int:
        """Memory of this view, as the service's cache of views counts it: a store split's key index
        (its vectors live in the library's part cache, under its own budget), or a table's arrays."""
        index = getattr(self.source, "index", None)
        if hasattr(index, "parts"):  # cropi.store's KeyIndex: three arrays, 16 bytes a prompt
            return 16 * len(index) + 256 * len(index.parts) + 4096
        if isinstance(self.source, _TableSource):
            return (self.source.vectors.nbytes + sum(getattr(v, "nbytes", 0) for v in self.source.columns.values())
                    + 100 * len(self.source.index) + 4096)
        return 4096

    def rows(self, prompt_ids: list[str]) -> list[str]:
        """``prompt_ids`` checked; UnknownIdError naming the missing ones."""
        missing = [p for p in prompt_ids if p not in self.source]
        if missing:
            raise UnknownIdError(f"{len(missing)} prompt id(s) not in split {self.meta.get('split')!r} of "
                                 f"checkpoint {self.meta.get('checkpoint')!r}: {missing[:5]}"
                                 + (" ..." if len(missing) > 5 else "")
                                 + "; GET the ranking for the ids this split holds")
        return list(prompt_ids)

    def records_json(self, prompt_ids: list[str], peek: bool = False) -> bytes:
        """A JSON array of records (metadata fields and the vector) for ``prompt_ids``, in that order.
        With ``peek``, NotLoaded unless that needs no read from disk."""
        done = {p: b for p in dict.fromkeys(prompt_ids) if (b := self.rendered.get((self._token, p))) is not None}
        todo = [p for p in dict.fromkeys(prompt_ids) if p not in done]
        if todo:
            done |= self._render_table(self._take(todo, peek))
        return b"".join((b"[", b",".join([done[p] for p in prompt_ids]), b"]"))  # joins: one copy each

    def _take(self, prompt_ids: list[str], peek: bool) -> Any:
        if not peek:
            return self.source.take(prompt_ids)
        table = self.source.cached(prompt_ids)
        if table is None:
            raise NotLoaded(prompt_ids[0])
        return table

    def _render_table(self, table: Any) -> dict[str, bytes]:
        columns = {c: _pylist(table.columns[c]) for c in GRADIENT_META_COLUMNS if c in table.columns}
        optional = {c: _pylist(table.columns[c]) for c in GRADIENT_OPTIONAL_COLUMNS if c in table.columns}
        out = {}
        for r, pid in enumerate(table.prompt_ids):
            meta = {"prompt_id": pid}
            for c, values in columns.items():
                v = values[r]
                meta[c] = _finite(v) if isinstance(v, float) else v
            for c in GRADIENT_OPTIONAL_COLUMNS:
                meta[c] = _finite(optional[c][r]) if c in optional else None
            head = json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()
            body = b"".join((head[:-1], b',"vector":[', vector_json_bytes(table.vectors[r]), b"]}"))
            out[pid] = self.rendered.put((self._token, pid), body)
        return out

    def arrow_stream(self, prompt_ids: list[str], peek: bool = False) -> memoryview:
        """An Arrow IPC stream: prompt_id, vector (fixed-size list in the stored dtype), metadata columns,
        and ``ess``, ``ess_fraction`` (float64, null where unknown) when the split was stored with them.

        The stream is a view of the buffer Arrow wrote it into, never copied into ``bytes``: Arrow writes
        without the GIL, while that copy (41 MB for a 10k-id batch at k=2048, its pages touched for the
        first time) held it for 30 ms at a time, and with it the event loop answering the health check
        (issue 31)."""
        data = self._take(list(prompt_ids), peek)
        vecs = np.ascontiguousarray(data.vectors)
        cols = {"prompt_id": pa.array(list(data.prompt_ids), pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), self.dim)}
        for c in GRADIENT_META_COLUMNS:
            if c in data.columns:
                cols[c] = pa.array(_pylist(data.columns[c]))
        for c in GRADIENT_OPTIONAL_COLUMNS:
            if c in data.columns:
                cols[c] = pa.array(_pylist(data.columns[c]), pa.float64(), from_pandas=True)
        meta = {k: str(v) for k, v in self.meta.items() if v is not None}
        table = pa.table(cols).replace_schema_metadata(meta)
        return ipc_stream(table)


def ipc_stream(table: pa.Table) -> memoryview:
    """``table`` as an Arrow IPC stream, in one buffer of exactly its size: its size measured first
    (writing to a mock stream copies no data), so the answer holds no growth slack beyond what the
    answer ledger counts (a growing buffer held 64 MB for a 39 MB stream)."""
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, table.schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), table.schema) as writer:
        writer.write_table(table)
    return memoryview(buffer)


class _TableSource:
    """An in-memory table (prompt_ids, vectors, columns) with the lookups a ``SplitReader`` has."""

    def __init__(self, data: Any):
        self.data = data
        # an owned copy: the store may hand out zero-copy views of memory-mapped shards, and a
        # shard truncated under a view held here would kill the server (SIGBUS) on the next read
        self.vectors = np.array(data.vectors, copy=True, order="C")
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(data.prompt_ids):
            raise InvalidInputError(f"stored vectors have shape {self.vectors.shape} for "
                                    f"{len(data.prompt_ids)} prompt ids")
        self.columns = {c: np.asarray(v) if not isinstance(v, np.ndarray) else v for c, v in data.columns.items()}
        self.index = {p: i for i, p in enumerate(data.prompt_ids)}

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.index

    def take(self, prompt_ids: list[str]) -> Any:
        rows = np.asarray([self.index[p] for p in prompt_ids], dtype=np.int64)
        return SimpleNamespace(prompt_ids=list(prompt_ids), vectors=self.vectors[rows],
                               columns={c: v[rows] for c, v in self.columns.items()})

    def cached(self, prompt_ids: list[str]) -> Any:
        return self.take(prompt_ids)
