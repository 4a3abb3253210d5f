"""The ``Projector`` base: parameter filtering, kept subsets, plans, input checks.

A projector maps a batch of per-parameter gradients to float32 vectors,
``P(g) = R g[S]``. This module owns what every kind shares:

- which parameters are projected (the spec's include/exclude filter);
- the kept subset ``S``: coordinate ``i`` of parameter ``name`` is kept iff
  ``to_unit_float(coord_hash(name_key(name, seed), i, stream=0)) < kept_fraction``,
  so a coordinate's fate never depends on other parameters or their order;
- per-chunk *plans* (kept indices plus whatever the kind derives from the
  hash, e.g. SJLT rows), built lazily on the projector's device and cached so
  repeated calls do no hashing. ``cache=False`` rebuilds them on every call:
  slower, but holds no per-coordinate memory (use it for huge models);
- bounded temporaries: parameters are walked in chunks of ``chunk_coords``
  coordinates and each chunk is upcast to float32 in pieces of at most
  ``chunk_coords`` elements of the batch.
"""

from __future__ import annotations

import abc
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

import torch

from cropi.errors import InvalidInputError
from cropi.projection.inputs import ProjectionInputError, check_shape, collect_grads
from cropi.projection.spec import ProjectionSpec, is_batched
from cropi.utils.hashing import coord_hash, name_key, top_bits

DEFAULT_CHUNK = 2**22


class EmptySelectionError(InvalidInputError):
    """The spec's include/exclude filter leaves no parameter to project."""


@dataclass
class Plan:
    """Kept coordinates of local range [start, stop) of one parameter."""

    start: int
    stop: int
    device: torch.device
    kept: torch.Tensor | None  # int32 offsets from ``start``; None: all kept
    cols: dict[str, torch.Tensor] = field(default_factory=dict)  # per-kept-coordinate data (last dim)

    @property
    def n_kept(self) -> int:
        return self.stop - self.start if self.kept is None else int(self.kept.numel())

    def index(self, a: int = 0, b: int | None = None) -> torch.Tensor:
        """Local coordinate indices (int64) of kept coordinates a..b-1 of this plan."""
        b = self.n_kept if b is None else b
        if self.kept is None:
            return torch.arange(self.start + a, self.start + b, device=self.device)
        return self.kept[a:b].long() + self.start


@dataclass
class Piece:
    """A slice [a, b) of a plan's kept list: what a projector applies at once."""

    plan: Plan
    a: int
    b: int
    offset: int  # position of its first kept coordinate in the concatenated kept list of all parameters

    def gather(self, chunk: torch.Tensor) -> torch.Tensor:
        """The kept columns of ``chunk`` (the plan's coordinate range), as float32."""
        if self.plan.kept is None:
            return chunk[:, self.a : self.b].float()
        return chunk.index_select(1, self.plan.kept[self.a : self.b]).float()

    def index(self) -> torch.Tensor:
        """Local coordinate indices (int64) of this piece's kept coordinates."""
        return self.plan.index(self.a, self.b)

    def col(self, name: str) -> torch.Tensor:
        return self.plan.cols[name][..., self.a : self.b]


class Projector(abc.ABC):
    """Projects named per-parameter gradients (batch first) to float32 vectors."""

    def __init__(self, spec: ProjectionSpec, param_shapes: Mapping[str, tuple[int, ...]],
                 device: str | torch.device = "cpu", *, cache: bool = True, chunk_coords: int = DEFAULT_CHUNK):
        if not 1 <= chunk_coords < 2**31:
            raise InvalidInputError(f"chunk_coords must be in [1, 2**31), got {chunk_coords}")
        self._spec = spec
        self.device = torch.device(device)
        self.cache = cache
        self.chunk_coords = chunk_coords
        self._all = {name: check_shape(name, shape) for name, shape in param_shapes.items()}
        self._shapes = {n: s for n, s in self._all.items() if self.selects(n)}
        if not self._shapes:
            raise EmptySelectionError(
                f"no parameter survives include={spec.include!r} exclude={spec.exclude!r} "
                f"(first names: {list(self._all)[:5]}); loosen the filter")
        self._keys = {n: name_key(n, spec.seed) for n in self._shapes}
        self._threshold = math.ceil(spec.kept_fraction * 2**24)  # keep iff top 24 bits < threshold
        self._plans: dict[str, list[Plan]] = {}
        self._counts: dict[str, int] = {}

    # -- public properties -------------------------------------------------
    @property
    def spec(self) -> ProjectionSpec:
        return self._spec

    @property
    def hook_path(self) -> bool:
        """Whether the batched hooks (cropi.gradients.hooks) compute this projector's vectors: its kind's
        batchedness, stated once (cropi.projection.spec.BATCHED_KINDS)."""
        return is_batched(self._spec)

    @property
    def out_dim(self) -> int:
        """Length of every output vector."""
        return int(self._spec.dim)

    @property
    def param_names(self) -> list[str]:
        """Projected parameters, in the order they were given."""
        return list(self._shapes)

    @property
    def n_coords(self) -> int:
        """Coordinates of the projected parameters, before subsetting."""
        return sum(math.prod(s) for s in self._shapes.values())

    @property
    def n_kept(self) -> int:
        """Exact size of the kept subset S (hashes every coordinate once)."""
        return sum(self.kept_count(n) for n in self._shapes)

    @property
    def cache_bytes(self) -> int:
        """Device memory held by cached plans (0 with ``cache=False``)."""
        tensors = [t for plans in self._plans.values() for p in plans for t in (p.kept, *p.cols.values())
                   if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def selects(self, name: str) -> bool:
        """Whether the spec's filter projects a parameter of this name."""
        inc, exc = self._spec.include, self._spec.exclude
        return (inc is None or re.search(inc, name) is not None) and not (exc is not None and re.search(exc, name))

    def kept_count(self, name: str) -> int:
        if name not in self._counts:
            self._counts[name] = sum(p.n_kept for p in self._iter_plans(name, with_cols=self.cache))
        return self._counts[name]

    def kept_indices(self, name: str) -> torch.Tensor:
        """Flat local indices (int64, ascending) of the kept coordinates of ``name``."""
        pieces = [p.index() for p in self._iter_plans(name, with_cols=self.cache)]
        return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=self.device)

    # -- projection --------------------------------------------------------
    def project(self, named_grads: Iterable[tuple[str, torch.Tensor]]) -> torch.Tensor:
        """Project a batch: each tensor is (n, *param_shape); returns float32 (n, out_dim)."""
        grads, n = collect_grads(named_grads, self._shapes, self._all, self.selects)
        out = self._new_out(n)
        piece_len = max(1, self.chunk_coords // max(n, 1))
        offset = 0  # running position in the concatenated kept list (identity's layout)
        for name in self._shapes:  # fixed order: results do not depend on the caller's order
            flat = grads[name].reshape(n, math.prod(self._shapes[name]))
            key, pos = self._keys[name], 0
            for plan in self._iter_plans(name, with_cols=True):
                chunk = flat[:, plan.start : plan.stop].to(self.device)
                for a in range(0, plan.n_kept, piece_len):
                    piece = Piece(plan, a, min(a + piece_len, plan.n_kept), offset + pos + a)
                    self._apply(out, piece.gather(chunk), piece, key)
                pos += plan.n_kept
            self._counts[name] = pos
            offset += pos
        return self._finish(out)

    def project_flat(self, grads: torch.Tensor) -> torch.Tensor:
        """Project (n, n_coords) rows laid out as the parameters in ``param_names`` order."""
        if grads.dim() != 2 or grads.shape[1] != self.n_coords:
            raise ProjectionInputError(f"project_flat needs shape (n, {self.n_coords}), got {tuple(grads.shape)}")
        sizes = [math.prod(s) for s in self._shapes.values()]
        parts = torch.split(grads, sizes, dim=1)
        return self.project((n, p.reshape(grads.shape[0], *s)) for (n, s), p in zip(self._shapes.items(), parts))

    # -- hooks for the kinds -----------------------------------------------
    def _new_out(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.out_dim, dtype=torch.float32, device=self.device)

    def _plan_cols(self, key: int, plan: Plan) -> dict[str, torch.Tensor]:
        """Per-kept-coordinate data a kind derives from the hash (last dim: plan.n_kept)."""
        return {}

    @abc.abstractmethod
    def _apply(self, out: torch.Tensor, values: torch.Tensor, piece: Piece, key: int) -> None:
        """Add the contribution of ``values`` (n, m float32 kept gradients) to ``out``."""

    def _finish(self, out: torch.Tensor) -> torch.Tensor:
        return out

    # -- plans -------------------------------------------------------------
    def _iter_plans(self, name: str, with_cols: bool) -> Iterator[Plan]:
        if name in self._plans:
            yield from self._plans[name]
            return
        numel, key, built = math.prod(self._shapes[name]), self._keys[name], []
        for start in range(0, numel, self.chunk_coords):
            plan = self._make_plan(key, start, min(start + self.chunk_coords, numel), with_cols)
            built.append(plan)
            yield plan
        if self.cache and with_cols:  # cache only complete plans
            self._plans[name] = built

    def _make_plan(self, key: int, start: int, stop: int, with_cols: bool) -> Plan:
        kept = None
        if self._threshold < 2**24:
            idx = torch.arange(start, stop, dtype=torch.int64, device=self.device)
            mask = top_bits(coord_hash(key, idx, stream=0), 24) < self._threshold
            kept = torch.nonzero(mask).squeeze(1).to(torch.int32)
        plan = Plan(start, stop, self.device, kept)
        if with_cols:
            plan.cols = self._plan_cols(key, plan)
        return plan
