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
"""

from __future__ import annotations

import math

import torch

from cropi.errors import InvalidInputError
from cropi.projection.inputs import collect_grads
from cropi.projection.layers import LayerProjector, group_sum
from cropi.utils.hashing import coord_hash, top_bits

IN_STREAM, OUT_STREAM = 3, 4
PAIR_CHUNK = 2**22  # (o, i) pairs hashed at once by ``project`` (bounds its temporaries)
DIRECT_MAX = 2**22  # the most (o, i) pairs of a layer the hook path forms per row (see direct_is_cheaper)


def group_rows(groups: torch.Tensor) -> list[torch.Tensor]:
    """Row indices of each group 0..max, in order."""
    order = torch.argsort(groups, stable=True)
    counts = torch.bincount(groups).tolist()
    return list(torch.split(order, counts))


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
    def keep_input(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The layer's input itself (rows, tokens, in): sketching it waits for the backward pass, so
        a pass holds inputs (as autograd does), not dim-wide sketches of every layer."""
        return x

    def layer_block(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups: torch.Tensor | None = None
                    ) -> tuple[int, int, torch.Tensor]:
        """(0, dim, values): each row's TensorSketch of ``sum_t delta_t x_t^T``, by whichever of two exact
        routes costs less for this layer and pass (``direct_is_cheaper``): the FFT of the two sides'
        count sketches, per token, or the row's gradient formed (one batched matmul) and scattered into
        its pair buckets. Same numbers up to rounding (tests/test_batched_sketch.py). With ``groups`` the
        direct route sums a group's gradients before scattering them (one scatter a prompt, not a row)."""
        if self.direct_is_cheaper(name, delta.shape[1]):
            h_out, s_out, h_in, s_in = self.hashes(name, delta.device)
            # the pair's sign s_out(o) s_in(i) applied on the sides: no out x in multiply
            d, x = delta * s_out.to(delta.dtype), kept * s_in.to(kept.dtype)
            if groups is None:
                g = torch.einsum("bto,bti->boi", d, x)                         # (rows, out, in)
            else:  # a group's tokens as one sequence: one (out x tokens) @ (tokens x in) product a group
                g = torch.stack([d[idx].reshape(-1, d.shape[-1]).T @ x[idx].reshape(-1, x.shape[-1])
                                 for idx in group_rows(groups)])
            bucket, _ = self.pair_hashes(name, delta.device)
            out = torch.zeros(g.shape[0], self.out_dim, dtype=g.dtype, device=g.device)
            return 0, self.out_dim, out.index_add_(1, bucket, g.reshape(g.shape[0], -1))
        spec_out = torch.fft.rfft(self.sketch(name, delta, "out"), dim=-1)   # (rows, tokens, dim // 2 + 1)
        spec_in = torch.fft.rfft(self.sketch(name, kept, "in"), dim=-1)
        summed = group_sum((spec_out * spec_in).sum(dim=1), groups)          # linear: sum over tokens first
        return 0, self.out_dim, torch.fft.irfft(summed, n=self.out_dim, dim=-1)

    def direct_is_cheaper(self, name: str, tokens: int) -> bool:
        """Forming the row's gradient costs ~2 T out in (a matmul) plus a scatter of out x in; the FFT route
        ~T (2 FFTs of dim, ~5 dim log2 dim each, over dim-wide arrays). On a small layer (or short rows)
        the first is several times cheaper; on a 1.5B model's layers the second, by far. The direct route
        also holds the layer's pair hashes (out x in, cached) and one (rows, out, in) gradient, so it is
        taken only while those stay under ``DIRECT_MAX``."""
        out_f, in_f = self._shapes[name]
        pairs = out_f * in_f
        fft = tokens * 10.0 * self.out_dim * max(1.0, math.log2(self.out_dim))
        return pairs <= DIRECT_MAX and pairs * (2.0 * tokens + 8.0) < fft

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
                        groups: torch.Tensor | None = None) -> tuple[int, int, torch.Tensor]:
        """The input embedding's share: its gradient is ``sum_t e_{token_t} g_t^T``, so coordinate
        (token_t, i) gets ``g_t[i]``: scattered straight into its bucket (one-hot side: no FFT)."""
        h_out, s_out, h_in, s_in = self.hashes(name, g.device)
        bucket = (h_out[tokens][..., None] + h_in) % self.out_dim                   # (rows, tokens, in)
        values = g * (s_out[tokens].to(g.dtype) * mask[..., 0])[..., None] * s_in.to(g.dtype)
        rows = torch.arange(g.shape[0], device=g.device) if groups is None else groups
        n = g.shape[0] if groups is None else int(groups.max()) + 1
        flat = (rows[:, None, None] * self.out_dim + bucket).reshape(-1)  # (group, bucket) as one index
        out = torch.zeros(n * self.out_dim, dtype=g.dtype, device=g.device).index_add_(0, flat, values.reshape(-1))
        return 0, self.out_dim, out.reshape(n, self.out_dim)
