"""TensorSketch of linear layers' gradients into one shared vector (Pham and Pagh, KDD 2013).

Why not the factored kind: a per-example gradient ``G = sum_t delta_t x_t^T`` is often close to
rank one (on the fidelity model, 99% of its squared norm sits in the tied embedding / output
matrix, in <= 20 vocabulary rows, one singular value 0.9 of the energy). For ``G1 = a b^T`` and
``G2 = c d^T`` the factored estimate ``<P_out G1 P_in^T, P_out G2 P_in^T>`` is
``(a^T P_out^T P_out c) (b^T P_in^T P_in d)``: a product of two JL estimates of dimension
``factor_out`` and ``factor_in``, whose error shrinks as 1/sqrt(factor), not as
1/sqrt(factor_out * factor_in). In count-sketch terms, coordinates (o, i) and (o', i) collide
whenever o and o' do, for every i at once. docs/batched_scoring.md has the measurements.

A TensorSketch is a count sketch of ``vec(G)`` whose hash of coordinate (o, i) is built from one
hash per side:

    bucket(o, i) = (h_out(o) + h_in(i)) mod dim,      sign(o, i) = s_out(o) s_in(i)
    P(G)[b]      = sum_{(o, i): bucket = b} sign(o, i) G[o, i]

Two distinct pairs (o, i) != (o', i') share a bucket with probability 1/dim, as in a plain count
sketch (one equation in independent uniform buckets), not 1/factor_out for every i at once, and the
signs cancel in expectation, so ``E <P(G1), P(G2)> = <G1, G2>`` with variance O(|G1|^2 |G2|^2 / dim)
for any rank. And it never needs ``G``: for one token the sketch of ``delta x^T`` is the circular
convolution of the count sketches ``C_out delta`` and ``C_in x``, so

    P(G) = irfft( sum_t rfft(C_out delta_t) * rfft(C_in x_t) )

which the hooks (cropi.gradients.hooks) compute from the layer's input kept on the forward pass
and ``delta_t`` on the backward pass. Every projected layer adds into the same ``dim`` outputs
(independent hashes per layer: ``name_key`` of the layer's name), so the vector is a sketch of the
concatenated gradient, as one count sketch of all parameters would be.

Hashes: ``h`` and ``s`` of coordinate j on one side come from ``coord_hash(name_key, j, stream)``
(stream 3: the input side, 4: the output side): the bucket is ``(top 32 bits * dim) >> 32``, the
sign is the lowest bit. Which parameters: as the factored kind (2-d ``.weight`` of linear layers
and of the input embedding; a tied embedding / output matrix is one parameter, both uses summed).

Two engines compute the hook path, with the same numbers up to float rounding (tests/test_batched_sketch.py
checks both against brute-force gradients, on CPU; the ``gpu`` test checks CUDA against CPU):

- ``cpu`` (every device but CUDA; the reference): per layer the cheaper of two exact routes by the CPU's
  cost (``direct_is_cheaper``), scatters (``index_add_``) for hashing and signing;
- ``cuda``: no host synchronisation anywhere in the per-layer work (the groups' sizes come from the host,
  ``RowGroups``; plans are built once per layer and cached); the factors stay in the model's dtype
  (bfloat16) and every product accumulates in float32 (``matmul_acc``); the direct route forms a
  group's gradient as one tensor-core matrix product over the group's tokens (no per-row gradients),
  in chunks of output rows that bound its memory, and adds its pairs unsigned into copies of the buckets
  at addresses that carry the pair's sign and unreduced bucket (``fold_sides``; ``ADDS_PER_COPY``,
  ``SCATTER_SPREAD``), folded once a layer; the FFT route count-sketches each side as a
  tensor-core matrix product over sorted hash blocks (``BlockSketch``: no float32 scatter-adds), and
  sketches and transforms tokens in chunks that bound its temporaries. Which route a layer takes
  follows ``CUDA_COSTS``, measured on an H200 (benchmarks/gpu/check.py times each route forced,
  benchmarks/gpu/scatter.py the scatter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cropi.errors import InvalidInputError
from cropi.projection.inputs import collect_grads
from cropi.projection.layers import LayerProjector, RowGroups, as_groups, group_sum
from cropi.utils.hashing import coord_hash, top_bits

IN_STREAM, OUT_STREAM = 3, 4
PAIR_CHUNK = 2**22  # (o, i) pairs hashed at once by ``project`` (bounds its temporaries)
DIRECT_MAX = 2**22  # the most (o, i) pairs of a layer the hook path forms per row (see direct_is_cheaper)
CUDA_PAIR_CHUNK = 2**25  # the cuda engine's direct route: pairs of a group's gradient formed at once
CUDA_FFT_CHUNK = 2**27  # the cuda engine's FFT route: elements of a chunk's widest array (tokens x dim, or the
# gathered side: tokens x ~n) formed at once
SKETCH_BLOCK = 128  # buckets per block of ``BlockSketch`` (a tensor-core tile's width)
# The cuda direct route adds a group's pairs into copies of its dim buckets (summed after): float32 atomics into
# only dim addresses serialise. On an H200, 13.8M pairs of a 8960 x 1536 layer into 4096 buckets: 0.74 ms as one
# index_add_, 0.22 ms over 16 copies (~210 adds an address), 0.19 ms over 128-1024 (at 32768 buckets: 0.29
# against 0.19 over 16-128; 2**25 elements of copies cost 0.77 ms in zeroing and summing):
# benchmarks/results/gpu/scatter.json. So as many copies as leave ADDS_PER_COPY adds an address (16: inside the
# measured plateau, 27 adds or fewer at 4096 buckets, 26 at 32768), at most SCATTER_SPREAD elements a group;
# Qwen2.5-1.5B's layers stay on that plateau, while a small layer, or a micro-batch of many short groups, gets
# few copies and zeroes little more than its own buckets. (The GPU check's figures were measured with
# SCATTER_SPREAD // dim copies for every layer: 512 at 4096 buckets, where this gives 210 for a 8960 x 1536 layer.)
# The folded layout (``fold_sides``) counts FOLDED * dim accumulators a copy, so the same rule leaves the same adds
# an address and the same cap on a group's accumulators.
SCATTER_SPREAD = 2**21
ADDS_PER_COPY = 16
FOLDED = 8  # a copy's accumulators in the direct route's folded layout: 4 sign quadrants x the 2 dim unwrapped sums


def scatter_copies(adds: int, dim: int) -> int:
    """How many copies of ``dim`` accumulators one index_add_ of ``adds`` pairs spreads over (the comment above)."""
    return max(1, min(SCATTER_SPREAD // dim, -(-adds // (dim * ADDS_PER_COPY))))


@dataclass(frozen=True)
class RouteCosts:
    """Seconds per unit of the two exact routes' work on one device, for choosing between them.

    ``flop``: a multiply-add of a matrix product (per flop; the factors' dtype on tensor cores);
    ``pair``: one (o, i) pair of a formed gradient hashed and added into its bucket;
    ``spectrum``: one dim-wide element of one token on one side (its sketch written, transformed,
    multiplied and summed); ``side``: one element of a token's factor count-sketched (read, gathered)."""

    flop: float
    pair: float
    spectrum: float
    side: float

    def direct(self, out_f: int, in_f: int, group_tokens: list[int]) -> float:
        return sum(2.0 * t * out_f * in_f * self.flop + out_f * in_f * self.pair for t in group_tokens)

    def fft(self, out_f: int, in_f: int, dim: int, tokens: int) -> float:
        return tokens * (2.0 * dim * self.spectrum + (out_f + in_f) * self.sketched)

    def presketch(self, out_f: int, in_f: int, dim: int, group_tokens: list[int]) -> float:
        """The direct route after count-sketching each side wider than ``dim`` (``presketched_sides``)."""
        a, b = min(out_f, dim), min(in_f, dim)
        wide = (out_f if out_f > dim else 0) + (in_f if in_f > dim else 0)
        return self.direct(a, b, group_tokens) + sum(group_tokens) * wide * self.sketched

    @property
    def sketched(self) -> float:
        """One element of a token's factor count-sketched by ``BlockSketch`` (gathered, one tile's products)."""
        return self.side + 2.0 * SKETCH_BLOCK * self.flop


# The cuda engine's costs, measured on an H200 in bfloat16 (benchmarks/results/gpu/): ``flop`` and ``pair`` from
# scatter.json (a 8960 x 1536 gradient over 5,120 tokens formed in 0.22 ms; its pairs added, spread, in 0.19 ms);
# ``spectrum`` and ``side`` from check_before_spread.json's routes forced, Qwen2.5-1.5B shape: the FFT route at
# k=32768 less the same at k=4096 over the dim-wide elements, then the rest of the FFT route at 4096 over the
# side elements. The presketch route, timed forced on an H200 (check.json, 2026-11-30), is 1.49x plain against
# direct's 1.38x at k=4096; the `side` its timings imply (8.2e-12) would choose it for the embedding alone, a
# gain below that run's noise, so `side` stays as measured first.
CUDA_COSTS = RouteCosts(flop=1.6e-15, pair=1.4e-11, spectrum=1.1e-11, side=1.2e-11)

_MM_OUT_DTYPE: dict[str, bool] = {}  # whether torch.mm / torch.bmm take out_dtype on this build (CUDA)


def matmul_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-d, or 3-d batched) accumulated and returned in float32 or wider. Factors in bfloat16
    (or float16) stay so: on CUDA the product runs on tensor cores with a float32 result
    (``out_dtype``); where this torch build lacks that, the half-precision product (float32 accumulation
    inside) is widened after, and elsewhere (CPU) the factors are widened first."""
    acc = torch.promote_types(a.dtype, torch.float32)
    if a.dtype == acc and b.dtype == acc:
        return a @ b
    if a.is_cuda and a.dtype == b.dtype:
        op = torch.mm if a.dim() == 2 else torch.bmm
        if _MM_OUT_DTYPE.get(op.__name__, True):
            try:
                out = op(a, b, out_dtype=acc)
                _MM_OUT_DTYPE[op.__name__] = True
                return out
            except torch.OutOfMemoryError:
                raise
            except (TypeError, RuntimeError, NotImplementedError):
                _MM_OUT_DTYPE[op.__name__] = False
        return (a @ b).to(acc)
    return a.to(acc) @ b.to(acc)


def mm_out_dtype_supported() -> dict[str, bool]:
    """What ``matmul_acc`` found (for the GPU check's record): {"mm": True, ...} once tried."""
    return dict(_MM_OUT_DTYPE)


class BlockSketch:
    """A count sketch ``C x`` (n -> dim, one bucket and sign per coordinate) as a batched matrix product.

    The coordinates are sorted by bucket and cut into blocks of ``width`` buckets; block b's coordinates
    (at most ``load``, padded with sign 0) are gathered from ``x`` and multiplied by the block's
    (load x width) matrix of signs: every bucket is the signed sum of its coordinates, as the
    scatter-add gives, with no atomic adds, in the factors' dtype on tensor cores with float32
    results (``matmul_acc``). ``width`` x ``load`` multiply-adds per (token, block), about
    ``width`` per coordinate: cheap next to moving the coordinate itself."""

    def __init__(self, bucket: torch.Tensor, sign: torch.Tensor, dim: int, width: int = SKETCH_BLOCK,
                 dtype: torch.dtype = torch.float32):
        n, device = bucket.numel(), bucket.device
        self.n, self.dim, self.width = n, dim, min(width, dim)
        self.blocks = -(-dim // self.width)
        order = torch.argsort(bucket, stable=True)
        sb = bucket[order]
        block = sb // self.width
        counts = torch.bincount(block, minlength=self.blocks)
        self.load = max(1, int(counts.max()))  # built once per layer and side (cached): the one read-back
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(n, device=device) - starts[block]
        self.src = torch.zeros(self.blocks, self.load, dtype=torch.long, device=device)
        self.src[block, pos] = order
        self.matrix = torch.zeros(self.blocks, self.load, self.width, dtype=dtype, device=device)
        self.matrix[block, pos, sb % self.width] = sign[order].to(dtype)
        self.src = self.src.reshape(-1)
        self.gathered = self.blocks * self.load  # elements a token's gathered side holds (about n, padded)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``C x`` along the last dimension of ``x`` (..., n): (..., dim), float32 or wider."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.n)
        gathered = flat.index_select(1, self.src).view(flat.shape[0], self.blocks, self.load)
        y = matmul_acc(gathered.transpose(0, 1), self.matrix.to(x.dtype))  # (blocks, tokens, width)
        return y.transpose(0, 1).reshape(*lead, self.blocks * self.width)[..., :self.dim]


class TensorSketchProjector(LayerProjector):
    """One shared ``dim``-vector: every projected layer's gradient TensorSketched into it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.spec.kind != "tensorsketch":
            raise InvalidInputError(f"TensorSketchProjector needs kind 'tensorsketch', got {self.spec.kind!r}")
        self._hashes: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def hashes(self, name: str, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(h_out, s_out, h_in, s_in)`` of layer ``name``: int64 buckets in [0, dim) and +-1 signs (float32)."""
        device = torch.device(device) if device is not None else self.device
        key = (name, str(device))
        if key not in self._hashes:
            out_f, in_f = self._shapes[name]
            sides = []
            for n, stream in ((out_f, OUT_STREAM), (in_f, IN_STREAM)):
                h = coord_hash(self._keys[name], torch.arange(n, dtype=torch.int64, device=device), stream)
                bucket = (top_bits(h, 32) * self.out_dim) >> 32  # < 2**56: no overflow; uniform to 2**-32
                sign = (h & 1).to(torch.float32).mul_(2.0).sub_(1.0)
                sides += [bucket, sign]
            self._hashes[key] = tuple(sides)
        return self._hashes[key]

    def sketch(self, name: str, x: torch.Tensor, side: str) -> torch.Tensor:
        """Count sketch ``C x`` of (..., n) along its last dimension with one side's hash: (..., dim)."""
        h_out, s_out, h_in, s_in = self.hashes(name, x.device)
        bucket, sign = (h_out, s_out) if side == "out" else (h_in, s_in)
        out = torch.zeros(*x.shape[:-1], self.out_dim, dtype=x.dtype, device=x.device)
        return out.index_add_(-1, bucket, x * sign.to(x.dtype))

    def project(self, named_grads) -> torch.Tensor:
        """From formed gradients, each (n, out, in): the count sketch of the pair hash; float32 (n, dim)."""
        grads, n = collect_grads(named_grads, self._shapes, self._all, self.selects)
        # float32 for float32 gradients (as the hook path), float64 for float64 checks
        dtype = torch.promote_types(next(iter(grads.values())).dtype, torch.float32)
        out = torch.zeros(n, self.out_dim, dtype=dtype, device=self.device)
        for name in self.param_names:
            g = grads[name].to(self.device, dtype)
            h_out, s_out, h_in, s_in = self.hashes(name)
            rows = max(1, PAIR_CHUNK // max(1, g.shape[2]))
            for a in range(0, g.shape[1], rows):  # a slice of output coordinates at a time
                bucket = (h_out[a:a + rows, None] + h_in[None, :]) % self.out_dim
                sign = (s_out[a:a + rows, None] * s_in[None, :]).to(dtype)
                out.index_add_(1, bucket.reshape(-1), (g[:, a:a + rows] * sign).reshape(n, -1))
        return out.float()

    # -- the batched hook path (cropi.gradients.hooks) -----------------------------------------
    masks_delta = True  # the hooks keep each layer's input itself (shared by the layers it feeds) and mask at the
    # backward, the narrower of delta and the input
    engine: str | None = None  # None: "cuda" on a CUDA device, "cpu" elsewhere; set to force one (tests, benchmarks)
    route: str | None = None  # None: the cheapest of "direct", "presketch" and "fft" per layer (cuda engine; the cpu
    # engine: "direct" or "fft"); set to force one (tests, the GPU check). Forced "presketch" is "direct" on a layer
    # with no side wider than dim

    def engine_for(self, device: torch.device) -> str:
        """Which engine computes the hook path for tensors on ``device`` (module docstring)."""
        return self.engine or ("cuda" if torch.device(device).type == "cuda" else "cpu")

    def keep_input(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The layer's input itself (rows, tokens, in), in the model's dtype: sketching it waits for the
        backward pass, so a pass holds inputs (as autograd does), not dim-wide sketches of every layer."""
        return x

    def layer_block(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups=None
                    ) -> tuple[int, int, torch.Tensor]:
        """(0, dim, values): each row's TensorSketch of ``sum_t delta_t x_t^T``, by whichever of two exact
        routes costs less for this layer and pass (``direct_is_cheaper``): the FFT of the two sides'
        count sketches, per token, or the row's gradient formed (one batched matmul) and scattered into
        its pair buckets. Same numbers up to rounding (tests/test_batched_sketch.py). With ``groups`` the
        direct route sums a group's gradients before scattering them (one scatter a prompt, not a row).
        Values in float32 (float64 for float64 factors), whatever the factors' dtype."""
        groups = as_groups(groups)
        if self.engine_for(delta.device) == "cuda":
            return 0, self.out_dim, self._cuda_block(name, delta, kept, groups)
        acc = torch.promote_types(delta.dtype, torch.float32)
        delta, kept = delta.to(acc), kept.to(acc)  # float32 / float64 factors: no copy (as before)
        direct = self.route == "direct" if self.route else self.direct_is_cheaper(name, delta.shape[1])
        if direct:
            h_out, s_out, h_in, s_in = self.hashes(name, delta.device)
            # the pair's sign s_out(o) s_in(i) applied on the sides: no out x in multiply
            d, x = delta * s_out.to(delta.dtype), kept * s_in.to(kept.dtype)
            if groups is None:
                g = torch.einsum("bto,bti->boi", d, x)                         # (rows, out, in)
            else:  # a group's tokens as one sequence: one (out x tokens) @ (tokens x in) product a group
                g = torch.stack([d[idx].reshape(-1, d.shape[-1]).T @ x[idx].reshape(-1, x.shape[-1])
                                 for idx in groups.members])
            bucket, _ = self.pair_hashes(name, delta.device)
            out = torch.zeros(g.shape[0], self.out_dim, dtype=g.dtype, device=g.device)
            return 0, self.out_dim, out.index_add_(1, bucket, g.reshape(g.shape[0], -1))
        spec_out = torch.fft.rfft(self.sketch(name, delta, "out"), dim=-1)   # (rows, tokens, dim // 2 + 1)
        spec_in = torch.fft.rfft(self.sketch(name, kept, "in"), dim=-1)
        summed = group_sum((spec_out * spec_in).sum(dim=1), groups)          # linear: sum over tokens first
        return 0, self.out_dim, torch.fft.irfft(summed, n=self.out_dim, dim=-1)

    def direct_is_cheaper(self, name: str, tokens: int) -> bool:
        """The cpu engine's choice. Forming the row's gradient costs ~2 T out in (a matmul) plus a scatter of
        out x in; the FFT route ~T (2 FFTs of dim, ~5 dim log2 dim each, over dim-wide arrays). On a small
        layer (or short rows) the first is several times cheaper; on a 1.5B model's layers the second, by
        far. The direct route also holds the layer's pair hashes (out x in, cached) and one (rows, out, in)
        gradient, so it is taken only while those stay under ``DIRECT_MAX``."""
        out_f, in_f = self._shapes[name]
        pairs = out_f * in_f
        fft = tokens * 10.0 * self.out_dim * max(1.0, math.log2(self.out_dim))
        return pairs <= DIRECT_MAX and pairs * (2.0 * tokens + 8.0) < fft

    def cuda_route(self, name: str, groups: RowGroups, tokens_per_row: int, costs: RouteCosts | None = None) -> str:
        """The cuda engine's choice for one layer and pass, by ``costs`` (``CUDA_COSTS``; the GPU check passes
        refit ones): the direct route's products run over a whole group's tokens (a prompt's responses), so its
        cost per token falls with the group's size, while the FFT route's is per token. Host arithmetic only."""
        if self.route:
            return self.route
        costs = costs or CUDA_COSTS
        out_f, in_f = self._shapes[name]
        group_tokens = groups.tokens(tokens_per_row)
        seconds = {"direct": costs.direct(out_f, in_f, group_tokens),
                   "fft": costs.fft(out_f, in_f, self.out_dim, sum(group_tokens))}
        if self.presketched_sides(name):
            seconds["presketch"] = costs.presketch(out_f, in_f, self.out_dim, group_tokens)
        return min(seconds, key=seconds.get)

    def presketched_sides(self, name: str) -> tuple[str, ...]:
        """The sides of layer ``name`` wider than ``dim``: the presketch route count-sketches them first."""
        out_f, in_f = self._shapes[name]
        return tuple(side for side, n in (("out", out_f), ("in", in_f)) if n > self.out_dim)

    def _cuda_block(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups: RowGroups | None
                    ) -> torch.Tensor:
        """The cuda engine (module docstring): (groups or rows, dim), float32 or wider."""
        if groups is None:  # every row its own group: host values only
            groups = RowGroups.of(range(delta.shape[0]), delta.device)
        route = self.cuda_route(name, groups, delta.shape[1])
        if route == "fft":
            return self._cuda_fft(name, delta, kept, groups)
        return self._cuda_direct(name, delta, kept, groups, self.presketched_sides(name) if route == "presketch" else ())

    def _cuda_direct(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups: RowGroups,
                     pre: tuple[str, ...] = ()) -> torch.Tensor:
        """Each group's gradient ``sum_t delta_t x_t^T`` as one product over its tokens (chunks of output
        rows), its pairs added unsigned at ``a(o) + b(i)`` (``fold_sides``) and the addresses folded after: no
        sign multiplied into ``x`` or the formed rows, no remainder taken per pair (one int32 add a pair).

        ``pre`` (the presketch route): those sides are count-sketched to ``dim`` first, so the product is
        ``(C_out delta)^T x`` (dim x in) or ``delta^T (C_in x)`` (out x dim), and its pairs go to ``u + h_in(i)``
        (or ``h_out(o) + v``) with the other side's sign only. Exact: grouping the pairs of ``G`` by ``h_out(o)``
        gives the same buckets, signs and sums (``P(G)[b] = sum_{u, i: u + h_in(i) = b mod dim} s_in(i)
        M[u, i]``, ``M = sum_t (C_out delta_t) x_t^T``). A gate or up projection of Qwen2.5-1.5B forms 4096 x 1536
        pairs instead of 8960 x 1536, the tied output layer 4096 x 1536 instead of 151936 x 1536. The sketched
        side is rounded to the factors' dtype (one rounding, of the size the model's own delta carries) so the
        product stays on tensor cores."""
        if pre:
            delta = self._presketch(name, "out", delta) if "out" in pre else delta
            kept = self._presketch(name, "in", kept) if "in" in pre else kept
        out_f, in_f = delta.shape[-1], kept.shape[-1]
        acc = torch.promote_types(delta.dtype, torch.float32)
        step = max(1, CUDA_PAIR_CHUNK // in_f)
        copies = scatter_copies(min(out_f, step) * in_f, FOLDED * self.out_dim)  # one index_add_'s pairs
        out = torch.zeros(groups.n, copies * FOLDED * self.out_dim, dtype=acc, device=delta.device)
        sides = [(delta[m].reshape(-1, out_f), kept[m].reshape(-1, in_f)) for m in groups.members]
        a_side, b_side = self.fold_sides(name, delta.device, copies, pre)
        for a in range(0, out_f, step):
            b = min(out_f, a + step)
            index = (a_side[a:b, None] + b_side[None, :]).reshape(-1)
            for j, (dj, xj) in enumerate(sides):
                out[j].index_add_(0, index, matmul_acc(dj[:, a:b].T, xj).reshape(-1))
        # (groups, sign quadrant, copy x wrap, dim): copies and the wrap summed, then the quadrants signed
        q = out.view(groups.n, 4, copies * 2, self.out_dim).sum(dim=2)
        return (q[:, 0] - q[:, 1]) - (q[:, 2] - q[:, 3])

    def _presketch(self, name: str, side: str, x: torch.Tensor) -> torch.Tensor:
        """``C x`` of one side (rows, tokens, n) -> (rows, tokens, dim) in ``x``'s dtype, by ``BlockSketch`` in chunks
        of tokens that bound its gathered copy (``CUDA_FFT_CHUNK`` elements)."""
        sk = self.block_sketch(name, side, x)
        flat = x.reshape(-1, x.shape[-1])
        step = max(1, CUDA_FFT_CHUNK // sk.gathered)
        out = torch.empty(flat.shape[0], self.out_dim, dtype=x.dtype, device=x.device)
        for t in range(0, flat.shape[0], step):
            out[t:t + step] = sk(flat[t:t + step])
        return out.view(*x.shape[:-1], self.out_dim)

    def fold_sides(self, name: str, device, copies: int, pre: tuple[str, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """The cuda direct route's addresses, int32, cached: pair (o, i) adds unsigned into ``a[o] + b[i]`` of a
        group's ``copies * FOLDED * dim`` accumulators, laid out (sign quadrant, copy, wrap, dim):

        - ``h_out(o) + h_in(i)`` lies in [0, 2 dim): its bucket ``mod dim`` is the wrap folded after;
        - input coordinate i goes to copy ``i % copies`` (against atomic contention, ``scatter_copies``);
        - the quadrant ``2 [s_out(o) < 0] + [s_in(i) < 0]``: the pair's sign is + in quadrants 0 and 3.

        A side in ``pre`` is already count-sketched (``_presketch``): its coordinate u is its bucket, its sign +.

        So the per-pair work is one add of two cached vectors, where signing the factors and reducing the
        sum ``mod dim`` cost three more passes over the pairs or the tokens (~11% of the default path's device time
        in benchmarks/results/gpu/check_before_fold.json's profile)."""
        key = ("fold", name, str(device), copies, tuple(pre))
        if key not in self._hashes:
            h_out, s_out, h_in, s_in = self.hashes(name, device)
            if pre:
                ident = torch.arange(self.out_dim, dtype=torch.int64, device=h_out.device)
                ones = torch.ones(self.out_dim, dtype=s_out.dtype, device=h_out.device)
                h_out, s_out = (ident, ones) if "out" in pre else (h_out, s_out)
                h_in, s_in = (ident, ones) if "in" in pre else (h_in, s_in)
            span = 2 * self.out_dim  # one copy: the unwrapped sums h_out + h_in
            i = torch.arange(h_in.shape[0], dtype=torch.int64, device=h_in.device)
            b = h_in + (i % copies) * span + (s_in < 0).long() * (copies * span)
            a = h_out + (s_out < 0).long() * (2 * copies * span)
            self._hashes[key] = (a.to(torch.int32), b.to(torch.int32))
        return self._hashes[key]

    def _cuda_fft(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups: RowGroups) -> torch.Tensor:
        """The two sides count-sketched by ``BlockSketch`` and transformed, chunk by chunk of (rows, tokens);
        the products summed over tokens, then over each group's rows; one inverse transform a group."""
        rows, tokens = delta.shape[:2]
        acc = torch.promote_types(delta.dtype, torch.float32)
        sk_out, sk_in = self.block_sketch(name, "out", delta), self.block_sketch(name, "in", kept)
        per_row = tokens * max(self.out_dim, sk_out.gathered, sk_in.gathered)  # a row's widest temporary
        row_step = max(1, CUDA_FFT_CHUNK // per_row)
        tok_step = tokens if per_row <= CUDA_FFT_CHUNK else max(1, CUDA_FFT_CHUNK * tokens // per_row)
        summed = None
        for r in range(0, rows, row_step):
            part = None
            for t in range(0, tokens, tok_step):
                a = torch.fft.rfft(sk_out(delta[r:r + row_step, t:t + tok_step]), dim=-1)
                a.mul_(torch.fft.rfft(sk_in(kept[r:r + row_step, t:t + tok_step]), dim=-1))
                part = a.sum(dim=1) if part is None else part.add_(a.sum(dim=1))
            summed = part if summed is None else torch.cat([summed, part])
        # back to real per row, then summed by group (the transform is linear; no complex scatter-add)
        return group_sum(torch.fft.irfft(summed, n=self.out_dim, dim=-1), groups).to(acc)

    def block_sketch(self, name: str, side: str, like: torch.Tensor) -> BlockSketch:
        """The cached ``BlockSketch`` of one side of layer ``name``, in ``like``'s dtype and device."""
        key = ("block", name, side, str(like.device), like.dtype)
        if key not in self._hashes:
            h_out, s_out, h_in, s_in = self.hashes(name, like.device)
            bucket, sign = (h_out, s_out) if side == "out" else (h_in, s_in)
            self._hashes[key] = BlockSketch(bucket, sign, self.out_dim, dtype=like.dtype)
        return self._hashes[key]

    def pair_hashes(self, name: str, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (out x in) pair buckets ``h_out(o) + h_in(i) mod dim`` and signs ``s_out(o) s_in(i)``, cached."""
        device = torch.device(device) if device is not None else self.device
        key = ("pairs", name, str(device))
        if key not in self._hashes:
            h_out, s_out, h_in, s_in = self.hashes(name, device)
            self._hashes[key] = (((h_out[:, None] + h_in[None, :]) % self.out_dim).reshape(-1),
                                 (s_out[:, None] * s_in[None, :]).reshape(-1))
        return self._hashes[key]

    def embedding_block(self, name: str, tokens: torch.Tensor, g: torch.Tensor, mask: torch.Tensor,
                        groups=None) -> tuple[int, int, torch.Tensor]:
        """The input embedding's share: its gradient is ``sum_t e_{token_t} g_t^T``, so coordinate
        (token_t, i) gets ``g_t[i]``: scattered straight into its bucket (one-hot side: no FFT). Once a
        pass, on either engine; the number of groups comes from the host."""
        groups = as_groups(groups)
        h_out, s_out, h_in, s_in = self.hashes(name, g.device)
        bucket = (h_out[tokens][..., None] + h_in) % self.out_dim                   # (rows, tokens, in)
        values = g * (s_out[tokens].to(g.dtype) * mask[..., 0])[..., None] * s_in.to(g.dtype)
        rows = torch.arange(g.shape[0], device=g.device) if groups is None else groups.index.to(g.device)
        n = g.shape[0] if groups is None else groups.n
        flat = (rows[:, None, None] * self.out_dim + bucket).reshape(-1)  # (group, bucket) as one index
        out = torch.zeros(n * self.out_dim, dtype=g.dtype, device=g.device).index_add_(0, flat, values.reshape(-1))
        return 0, self.out_dim, out.reshape(n, self.out_dim)
