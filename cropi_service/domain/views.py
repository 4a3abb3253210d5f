"""In-memory views of stored results, built once per stored version and served many times.

``RankingView``: the ranked prompts in fused order (and, on demand, in each validation set's
order), sliced into pages without touching the store. ``GradientView``: a split's vectors
with a prompt-id index and per-prompt metadata (ESS and ESS/K included), rendered as JSON
records or an Arrow IPC stream.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cropi.contracts import GRADIENT_META_COLUMNS, GRADIENT_OPTIONAL_COLUMNS, SCORE_PREFIX
from cropi.errors import InvalidInputError
from cropi.pipeline.rank import RankingResult
from cropi.store import GradientTable

from .cache import ByteLRU, NotLoaded
from ..base.errors import UnknownIdError

FUSED = "fused"
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


def _pylist(values: Any) -> list:
    """Python scalars from a list, numpy array or Arrow array."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_pylist()
    return np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values)


class RankingView:
    """The ranked (non-excluded) prompts of one stored ranking, in rank order.

    Each order's rows are encoded to JSON once, on first use; a page is then a join of
    ready-made fragments, so serving it costs microseconds whatever the pool size.
    """

    def __init__(self, data: RankingResult):
        table = data.table
        ranked = table.filter(pc.greater(table["rank"], 0))
        self.table = ranked.take(pc.sort_indices(ranked, [("rank", "ascending"), ("prompt_id", "ascending")]))
        self.validation = [c[len(SCORE_PREFIX):] for c in table.column_names if c.startswith(SCORE_PREFIX)]
        self.excluded = dict(data.excluded)
        self.meta = dict(data.meta)
        self._fragments: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return self.table.num_rows

    def ordered(self, order: str) -> pa.Table:
        """The ranked rows sorted by ``order``: 'fused' or a validation set's score (descending, ties by rank)."""
        if order == FUSED:
            return self.table
        if order not in self.validation:
            raise InvalidInputError(f"unknown validation set {order!r}; this ranking has {self.validation} "
                                    "(or leave `validation` out for the fused order)")
        score = np.nan_to_num(self.table[SCORE_PREFIX + order].to_numpy(zero_copy_only=False).astype(np.float64),
                              nan=-np.inf)
        rank = self.table["rank"].to_numpy()
        return self.table.take(np.lexsort((rank, -score)))

    def page_json(self, order: str, offset: int, limit: int, peek: bool = False) -> bytes:
        """Rows ``offset .. offset+limit`` of ``order``, as a JSON array of API records. With ``peek``,
        NotLoaded unless ``order`` is encoded already: never waits on the lock (an encoding of another
        order under way must not hold up the event loop)."""
        fragments = self._fragments.get(order)  # set whole, once encoded
        if fragments is None:
            if peek:
                raise NotLoaded(order)
            fragments = self._encoded(order)
        return b"[" + b",".join(fragments[offset:offset + limit]) + b"]"

    def _encoded(self, order: str) -> list[bytes]:
        with self._lock:  # one encoding per order, even under concurrent first requests
            if order not in self._fragments:
                self._fragments[order] = self._encode(self.ordered(order))
            return self._fragments[order]

    def _encode(self, table: pa.Table) -> list[bytes]:
        cols = table.to_pydict()
        selected = cols.get("selected")
        scores = [(v, cols[SCORE_PREFIX + v]) for v in self.validation]
        return [json.dumps({"position": i + 1, "prompt_id": pid, "rank": int(cols["rank"][i]),
                            "fused": _finite(cols["fused"][i]),
                            "scores": {v: _finite(s[i]) for v, s in scores},
                            "selected": selected[i] if selected is not None else None},
                           allow_nan=False, separators=(",", ":")).encode()
                for i, pid in enumerate(cols["prompt_id"])]


class GradientView:
    """One split's stored vectors with an index from prompt id to row.

    Rendered JSON records are kept in an LRU of at most ``render_cache_bytes`` (0: none). The
    cache belongs to this view, which is built for one stored version of the split: when the
    store changes, a new view (with an empty cache) replaces this one.
    """

    def __init__(self, data: GradientTable, render_cache_bytes: int = 0):
        self.prompt_ids = list(data.prompt_ids)
        # an owned copy: the store may hand out zero-copy views of memory-mapped shards, and a
        # shard truncated under a view held here would kill the server (SIGBUS) on the next read
        self.vectors = np.array(data.vectors, copy=True, order="C")
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.prompt_ids):
            raise InvalidInputError(f"stored vectors have shape {self.vectors.shape} for "
                                    f"{len(self.prompt_ids)} prompt ids")
        self.columns = {c: _pylist(data.columns[c]) for c in GRADIENT_META_COLUMNS if c in data.columns}
        # ESS and ESS/K: absent from splits stored before they existed (null in JSON, no Arrow column)
        self.optional = {c: _pylist(data.columns[c]) for c in GRADIENT_OPTIONAL_COLUMNS if c in data.columns}
        self.meta = {"checkpoint": data.checkpoint.name, "split": data.split, "spec_id": data.spec_id,
                     "fingerprint": getattr(data.checkpoint, "fingerprint", None)}
        self.index = {p: i for i, p in enumerate(self.prompt_ids)}
        self.rendered = ByteLRU(render_cache_bytes)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def rows(self, prompt_ids: list[str]) -> list[int]:
        """Row numbers of ``prompt_ids``; UnknownIdError naming the missing ones."""
        missing = [p for p in prompt_ids if p not in self.index]
        if missing:
            raise UnknownIdError(f"{len(missing)} prompt id(s) not in split {self.meta.get('split')!r} of "
                                 f"checkpoint {self.meta.get('checkpoint')!r}: {missing[:5]}"
                                 + (" ..." if len(missing) > 5 else "")
                                 + "; GET the ranking for the ids this split holds")
        return [self.index[p] for p in prompt_ids]

    def records_json(self, rows: list[int]) -> bytes:
        """A JSON array of records (metadata fields and the vector) for ``rows``."""
        return b"".join((b"[", b",".join([self.record_json(r) for r in rows]), b"]"))  # joins: one copy each

    def record_json(self, r: int) -> bytes:
        """Row ``r`` as a JSON record, from the render cache when it was rendered before."""
        body = self.rendered.get(r)
        if body is None:
            body = self.rendered.put(r, self._render(r))
        return body

    def _render(self, r: int) -> bytes:
        meta = {"prompt_id": self.prompt_ids[r]}
        for c, values in self.columns.items():
            v = values[r]
            meta[c] = _finite(v) if isinstance(v, float) else v
        for c in GRADIENT_OPTIONAL_COLUMNS:
            meta[c] = _finite(self.optional[c][r]) if c in self.optional else None
        head = json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()
        return b"".join((head[:-1], b',"vector":[', vector_json_bytes(self.vectors[r]), b"]}"))

    def arrow_stream(self, rows: list[int]) -> bytes:
        """An Arrow IPC stream: prompt_id, vector (fixed-size list in the stored dtype), metadata columns,
        and ``ess``, ``ess_fraction`` (float64, null where unknown) when the split was stored with them."""
        idx = np.asarray(rows, dtype=np.int64)
        vecs = np.ascontiguousarray(self.vectors[idx])
        flat = pa.array(vecs.reshape(-1))
        cols = {"prompt_id": pa.array([self.prompt_ids[r] for r in rows], pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(flat, self.dim)}
        for c, values in self.columns.items():
            cols[c] = pa.array([values[r] for r in rows])
        for c, values in self.optional.items():
            cols[c] = pa.array([values[r] for r in rows], pa.float64(), from_pandas=True)
        meta = {k: str(v) for k, v in self.meta.items() if v is not None}
        table = pa.table(cols).replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()
