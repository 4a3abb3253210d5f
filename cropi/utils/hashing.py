"""Counter-based hashing that gives the same bits on every device.

Everything random in a projection (which coordinates are kept, where each
kept coordinate lands, the dense matrix entries) is a pure function of
``(seed, parameter name, coordinate index, stream)``, computed here. Nothing is
drawn from a stateful generator, so a coordinate's fate never depends on the
order in which it is visited, on the device, or on the process.

Definitions (all arithmetic modulo 2**64 on unsigned 64-bit words)::

    mix(z)          = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
                      z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
    splitmix64(x)   = mix(x + GAMMA)                GAMMA = 0x9E3779B97F4A7C15
    name_key(n, s)  = first 8 bytes (little endian) of
                      sha256(b"cropi.projection.v1\\0" + str(s) + b"\\0" + utf8(n))
    stream_key(k,t) = splitmix64(k + t * STREAM_STEP)  STREAM_STEP = 0xD1B54A32D192ED03
    coord_hash(k,i,t) = splitmix64(stream_key(k, t) + i * GAMMA)

so ``coord_hash(k, ., t)`` is the output sequence of a SplitMix64 generator
seeded with ``stream_key(k, t)``, read at position ``i``. Torch has no unsigned
64-bit type: tensors hold the same bit patterns as two's-complement int64, the
multiplications wrap, and logical right shifts are emulated by masking off the
sign-extended bits of an arithmetic shift.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a function needs it: short_hash must stay torch-free
    import torch

# json.dumps' own separators: hashes written into stores before short_hash existed used them.
SPACED = (", ", ": ")
COMPACT = (",", ":")


def short_hash(obj: Any, *, separators: tuple[str, str] = COMPACT, ensure_ascii: bool = True) -> str:
    """First 16 hex digits of sha256 over ``obj`` as sorted-key JSON (non-JSON values as ``str``).

    The one short content hash of cropi (resume keys, trajectory-store keys, identity
    hashes). ``separators`` and ``ensure_ascii`` exist only to reproduce hashes already on disk.
    """
    blob = json.dumps(obj, sort_keys=True, separators=separators, ensure_ascii=ensure_ascii, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
STREAM_STEP = 0xD1B54A32D192ED03
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_NAME_DOMAIN = b"cropi.projection.v1\0"


def to_signed(x: int) -> int:
    """The int64 value with the same bit pattern as the 64-bit word ``x``."""
    x &= MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64_(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on an int64 tensor, in place (returns ``z``)."""
    import torch

    t = torch.empty_like(z)
    for shift, mul in ((30, _MUL1), (27, _MUL2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=t)
        z.bitwise_xor_(t.bitwise_and_((1 << (64 - shift)) - 1))  # logical shift: drop sign-extended bits
        if mul is not None:
            z.mul_(to_signed(mul))
    return z


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """``mix(x + GAMMA)`` elementwise on an int64 tensor; returns a new tensor."""
    import torch

    if x.dtype != torch.int64:
        raise TypeError(f"splitmix64 needs an int64 tensor, got {x.dtype}")
    return mix64_(x + to_signed(GAMMA))


def splitmix64_int(x: int) -> int:
    """Pure-Python SplitMix64 on one 64-bit word; returns a word in [0, 2**64)."""
    z = (x + GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def name_key(name: str, seed: int) -> int:
    """Stable 64-bit key of a parameter name under a seed, in [0, 2**64).

    Derived from sha256, never Python's ``hash()``, so it is the same in every
    process and on every machine.
    """
    payload = _NAME_DOMAIN + str(int(seed)).encode() + b"\0" + name.encode("utf-8")
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "little")


def stream_key(key: int, stream: int) -> int:
    """Seed of the independent hash sequence ``stream`` under ``key``."""
    return splitmix64_int((key + stream * STREAM_STEP) & MASK64)


def coord_hash(key: int, idx: torch.Tensor, stream: int) -> torch.Tensor:
    """64-bit hash (as int64) of each coordinate index in ``idx`` under ``key``.

    ``idx`` is an int64 tensor of non-negative indices on any device; the
    result has its shape and device and identical bits everywhere.
    """
    import torch

    if idx.dtype != torch.int64:
        raise TypeError(f"coord_hash needs int64 indices, got {idx.dtype}")
    base = to_signed(stream_key(key, stream) + GAMMA)  # splitmix64's own increment folded in
    return mix64_(idx * to_signed(GAMMA) + base)


def coord_hash_grid(key: int, idx: torch.Tensor, width: int, stream: int) -> torch.Tensor:
    """``coord_hash(key, idx[:, None] * width + arange(width), stream)``, shape (len(idx), width).

    Computed as one broadcast add of a per-index and a per-column term, which
    saves passes over the grid (dense projections hash k entries per coordinate).
    """
    import torch

    if idx.dtype != torch.int64 or idx.dim() != 1:
        raise TypeError(f"coord_hash_grid needs 1-d int64 indices, got {idx.dtype} with shape {tuple(idx.shape)}")
    base = to_signed(stream_key(key, stream) + GAMMA)
    cols = torch.arange(width, dtype=torch.int64, device=idx.device).mul_(to_signed(GAMMA))
    rows = idx * to_signed(width * GAMMA) + base
    return mix64_(rows[:, None] + cols[None, :])


def top_bits(h: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` most significant bits of each 64-bit hash, as non-negative int64."""
    return _shr(h, 64 - n)


def bit_field(h: torch.Tensor, shift: int, n: int) -> torch.Tensor:
    """Bits ``shift .. shift+n-1`` of each hash, as non-negative int64."""
    return (h >> shift) & ((1 << n) - 1)


def to_unit_float(h: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1) from the top 24 bits of each hash (exact: m / 2**24)."""
    import torch

    return top_bits(h, 24).to(torch.float32) * (2.0**-24)
