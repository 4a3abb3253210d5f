"""``ProjectionSpec``: everything that determines a projected vector.

Two vectors may be compared only if their specs are equal; ``spec_id`` is the
short stable name stores and manifests use for a spec.

Field meanings:

- ``kind``: ``sjlt`` (sparse JL / count-sketch, ``nnz`` nonzeros per kept
  column), ``gaussian`` (dense N(0, 1/k)), ``rademacher`` (dense +-1/sqrt(k)),
  ``identity`` (the kept coordinates themselves, no mixing).
- ``dim``: k, the output length. Ignored by ``identity`` (whose output length
  is the number of kept coordinates): leave it unset (or None) there; it is
  stored as None so equal identity specs have equal ids.
- ``kept_fraction``: the *expected* fraction of coordinates kept. Each
  coordinate is kept independently (a hashed Bernoulli draw), so the exact
  count varies; the projector reports it as ``n_kept``.
- ``seed``: seeds every hash. ``nnz``: nonzeros per column (``sjlt`` only;
  the other kinds ignore it, though it still enters ``spec_id``).
- ``include`` / ``exclude``: regular expressions matched with ``re.search``
  against parameter names; a parameter is projected iff it matches
  ``include`` (or include is None) and does not match ``exclude``.
- ``identity_limit``: the most coordinates an ``identity`` projector will emit.
- ``factored`` (cropi.projection.factored): per linear layer ``W`` (out x in), the
  Kronecker-factored block ``P_out G P_in^T`` (``factor_out`` x ``factor_in``) of its
  gradient ``G``, blocks concatenated in parameter order. It projects the 2-d ``.weight``
  of every linear layer and of the input embedding that the filter selects (with tied
  weights the embedding / output-layer matrix is one parameter, one block); biases and
  norms (1-d) are never projected. ``dim`` is derived (layers x factor_out x factor_in:
  leave it unset) and nothing is subsampled (``kept_fraction`` is 1).
- ``factor_in`` / ``factor_out``: the factored kind's per-layer sizes; None for every
  other kind, and then absent from ``spec_id`` (ids of stored specs are unchanged).
- ``tensorsketch`` (cropi.projection.tensorsketch): the same parameters as ``factored`` (2-d
  weights of linear layers and the input embedding) and the same batched hook path, but every
  layer's gradient ``G`` is count-sketched into one shared ``dim``-vector with the pair hash
  ``bucket(o, i) = h_out(o) + h_in(i) mod dim``, ``sign = s_out(o) s_in(i)`` (Pham and Pagh's
  TensorSketch): computed per token from the two sides' count sketches by FFT, so ``G`` is never
  formed, and its error shrinks as 1/sqrt(dim) even for rank-one gradients, where the factored
  kind's shrinks only as 1/sqrt(factor) (docs/batched_scoring.md). ``kept_fraction`` is 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cropi.errors import MismatchError

# The one default spec (``DEFAULT_SPEC``, below: tensorsketch, dim 4096): every field a caller leaves
# out takes its value from it, whatever the door (a partial spec, ``--projection-dim 8192`` alone, a
# service request without a projection), and the CLI's help prints it. Why this one: the smallest
# measured spec that meets the fidelity goal on every projection seed (precision@10% 0.972 on each of
# 3 seeds at 2568x; benchmarks/results/fidelity_factored_tensorsketch.json), and it is computed on the
# batched path (benchmarks/results/batched_scoring.json). Stored specs keep their ids: a store records
# every field, so changing a default never changes what a stored spec_id means.
DEFAULT_KIND = "tensorsketch"
DEFAULT_DIM = 4096
DEFAULT_KEPT_FRACTION = 1.0  # the batched kinds keep every coordinate; another kind is sized to match
DEFAULT_FACTOR = 16
FACTOR_FIELDS = ("factor_in", "factor_out")  # dropped from spec_id while None
MAX_DIM = 2**24  # keeps row indices in int32 and dense entry indices far from int64 overflow
MAX_SEED = 2**63 - 1
MAX_FACTOR = 4096


# Kinds whose vectors come from one batched forward and backward over many examples' rows
# (cropi.gradients.hooks), per-example gradients never formed.
BATCHED_KINDS = ("factored", "tensorsketch")


def is_batched(spec: "ProjectionSpec") -> bool:
    """Whether ``spec``'s kind is computed on the batched hook path."""
    return spec.kind in BATCHED_KINDS


class SpecMismatchError(MismatchError):
    """A stored spec does not match its recorded spec_id, or two specs differ."""


class ProjectionSpec(BaseModel):
    """How gradients are projected; part of every stored vector's identity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The descriptions are the one spelling of each field's help: the CLI's flags (cropi/cli_args.py) and
    # the service's schema (its caller model is derived from this one) both show them.
    kind: Literal["sjlt", "gaussian", "rademacher", "identity", "factored", "tensorsketch"] = Field(
        DEFAULT_KIND, description="projection kind: sjlt (sparse count-sketch), gaussian (dense N(0, 1/k)), rademacher "
        "(dense +-1/sqrt(k)), identity (the kept coordinates, unmixed), factored (per-layer blocks, batched) or "
        "tensorsketch (one shared sketch of dim, batched)")
    dim: int | None = Field(DEFAULT_DIM, description="k, the projected vector's length (derived for the identity "
                            "and factored kinds: leave it unset there)")
    kept_fraction: float = Field(DEFAULT_KEPT_FRACTION, description="expected fraction r of gradient coordinates "
                                 "kept, each by its own hashed draw (so the exact count varies); 1 for the factored "
                                 "and tensorsketch kinds")
    seed: int = Field(0, description="seeds every hash of the projection (which coordinates, which signs)")
    nnz: int = Field(4, description="nonzeros per kept coordinate (sjlt only; the other kinds ignore it, "
                     "though it still enters spec_id)")
    include: str | None = Field(None, description="regular expression (re.search on parameter names): only "
                                "parameters that match are projected")
    exclude: str | None = Field(None, description="regular expression: parameters that match are not projected")
    identity_limit: int = Field(2**24, description="the most coordinates an identity projection emits")
    factor_in: int | None = Field(None, description="the factored kind's per-layer input size (unset: "
                                  f"{DEFAULT_FACTOR}; None for every other kind)")
    factor_out: int | None = Field(None, description="the factored kind's per-layer output size (unset: "
                                   f"{DEFAULT_FACTOR}; None for every other kind)")

    @model_validator(mode="before")
    @classmethod
    def _derived_dim(cls, data: Any) -> Any:
        kind = data.get("kind", DEFAULT_KIND) if isinstance(data, Mapping) else None  # left out: the default's
        if kind == "tensorsketch":
            if data.get("kept_fraction", 1.0) != 1.0:
                default = "" if "kind" in data else " (tensorsketch is the default kind: name kind='sjlt' to subsample)"
                raise ValueError("kept_fraction is ignored for kind='tensorsketch' (every coordinate of a projected "
                                 f"layer is sketched); leave it unset, got {data['kept_fraction']!r}{default}")
            return {**data, "kept_fraction": 1.0}
        if kind not in ("identity", "factored"):
            return data
        dim = data.get("dim")
        if dim is not None and dim != DEFAULT_DIM:
            what = "the kept count" if kind == "identity" else "layers x factor_out x factor_in"
            raise ValueError(f"dim is ignored for kind={kind!r} (its output length is {what}); "
                             f"leave dim unset, got dim={dim!r}")
        data = {**data, "dim": None}
        if kind == "factored":
            if data.get("kept_fraction", 1.0) != 1.0:
                raise ValueError("kept_fraction is ignored for kind='factored' (every coordinate of a projected "
                                 f"layer enters its block); leave it unset, got {data['kept_fraction']!r}")
            data = {"factor_in": DEFAULT_FACTOR, "factor_out": DEFAULT_FACTOR,
                    **{k: v for k, v in data.items() if k not in FACTOR_FIELDS or v is not None},
                    "kept_fraction": 1.0, "dim": None}
        return data

    @field_validator("kept_fraction")
    @classmethod
    def _check_fraction(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError(f"kept_fraction must be in (0, 1], got {v!r}")
        return v

    @field_validator("seed")
    @classmethod
    def _check_seed(cls, v: int) -> int:
        if not 0 <= v <= MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**63 - 1], got {v!r}")
        return v

    @field_validator("identity_limit")
    @classmethod
    def _check_limit(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"identity_limit must be >= 1, got {v!r}")
        return v

    @field_validator("include", "exclude")
    @classmethod
    def _check_regex(cls, v: str | None, info) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"{info.field_name} is not a valid regular expression ({exc}): {v!r}") from None
        return v

    @model_validator(mode="after")
    def _check_dim_and_nnz(self) -> "ProjectionSpec":
        factors = [self.factor_in, self.factor_out]
        if self.kind != "factored" and factors != [None, None]:
            raise ValueError(f"factor_in and factor_out belong to kind='factored'; leave them unset for "
                             f"kind={self.kind!r}")
        if self.kind == "factored" and not all(1 <= f <= MAX_FACTOR for f in factors):
            raise ValueError(f"factor_in and factor_out must be integers in [1, {MAX_FACTOR}], got {factors}")
        if self.kind in ("identity", "factored"):
            return self
        if self.dim is None or not 1 <= self.dim <= MAX_DIM:
            raise ValueError(f"dim must be an integer in [1, {MAX_DIM}] for kind={self.kind!r}, got {self.dim!r}")
        hi = self.dim if self.kind == "sjlt" else None
        if self.nnz < 1 or (hi is not None and self.nnz > hi):
            raise ValueError(f"nnz must be in [1, dim={self.dim}] for kind='sjlt' (and >= 1 otherwise), got {self.nnz!r}")
        return self

    def recorded(self) -> dict:
        """The spec as ids and resume keys record it: the factor fields only when set, so every spec
        recorded before the factored kind existed keeps its identity."""
        return {k: v for k, v in self.model_dump(mode="json").items() if not (k in FACTOR_FIELDS and v is None)}

    @property
    def spec_id(self) -> str:
        """First 16 hex digits of sha256 over the canonical (sorted-key) JSON of ``recorded()``."""
        canon = json.dumps(self.recorded(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "ProjectionSpec":
        """Rebuild a spec from a manifest record, checking its ``spec_id`` if present."""
        fields = {k: v for k, v in record.items() if k != "spec_id"}
        spec = cls(**fields)
        recorded = record.get("spec_id")
        if recorded is not None and recorded != spec.spec_id:
            raise SpecMismatchError(f"recorded spec_id {recorded!r} does not match the spec's fields "
                                    f"(which hash to {spec.spec_id!r}): the record was edited or is corrupt")
        return spec

    def require_same(self, other: "ProjectionSpec") -> None:
        """Raise ``SpecMismatchError`` unless ``other`` is the same spec."""
        if other.spec_id != self.spec_id:
            raise SpecMismatchError(f"projection specs differ ({self.spec_id} vs {other.spec_id}): vectors "
                                    "projected under different specs cannot be compared; re-project one side")


# Every field at its default: what scoring, curricula, `cropi gradients` / `cropi score` and the service
# use when no projection is named, and what fills every field a partial spec leaves out.
DEFAULT_SPEC = ProjectionSpec()

# The one default, per device: where vectors are computed decides which spec is fastest at full fidelity, so
# the default is looked up here (``default_spec``) by every door that fills in a projection left out (the
# gradients job, the score request); no other table of defaults exists. CPU: DEFAULT_SPEC, as measured
# (fidelity_factored_tensorsketch.json, batched_scoring.json). CUDA: the same spec. k=32768 measured 0.7-11%
# faster on an H200 before the direct route's folded addresses (check_before_*.json, check_spread_run1.json) and
# 1-2% slower after (check_fold_mask_delta.json, check.json: 0.180 against 0.177 s a prompt); its vectors are 8x
# larger (128 GB for a million prompts), and a spec that
# differs by device would make vectors computed on CPU and on a GPU incomparable; k=4096 meets the fidelity
# goal in bfloat16 (fidelity_bfloat16.json). A partial spec (a field or two named) is always completed from
# DEFAULT_SPEC's fields, on every device.
DEVICE_DEFAULTS: dict[str, ProjectionSpec] = {"cpu": DEFAULT_SPEC, "cuda": DEFAULT_SPEC}


def default_spec(device: str = "cpu") -> ProjectionSpec:
    """The default spec for vectors computed on ``device`` ('cpu', 'cuda', 'cuda:1', ...; 'auto' is
    resolved as the gradients job resolves it, which needs torch); a device type not in
    ``DEVICE_DEFAULTS`` gets CPU's."""
    device = str(device)
    if device == "auto":
        from cropi.utils.device import resolve_device

        device = resolve_device(device)
    return DEVICE_DEFAULTS.get(device.split(":")[0], DEFAULT_SPEC)

# Not a second default but a purpose of its own: the online filters (cropi.trainers.filters) project
# each response of every training step, where packing cannot serve; there the tensorsketch costs about a
# weight gradient per row, so they keep the factored kind (16x16) for its cost, with its weaker measured
# fidelity (docs/online_filtering.md, "With the scoring spec instead of the factored one"). Their
# ``projection`` option picks another.
ONLINE_FILTER_SPEC = ProjectionSpec(kind="factored")
