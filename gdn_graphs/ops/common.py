"""What the kernels of decode.py, chunk.py and conv.py share: Triton helpers and host-side checks.

Triton helpers (inlined into the kernels that call them):
    softplus       torch's softplus with its threshold (x > 20 -> x)
    inv_l2norm     the factor rsqrt(sum x^2 + 1e-6) that l2-normalises x (as reference.l2norm)
    gdn_gate       the GDN gates: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)

Host side (metadata only: no device sync, no allocation):
    FLOAT_DTYPES   the float dtypes every kernel takes (fp16, bf16, fp32)
    interpreting   whether kernels run under the Triton interpreter (TRITON_INTERPRET=1)
    fail           the ValueError of a failed check, "<function>: <message>"
    check_slots    an int32 slot (or offset) table: dims, length, contiguity, device
    check_meta     a ChunkMeta: int32 1-D contiguous tables of consistent lengths, block size
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.meta import ChunkMeta

__all__ = ["FLOAT_DTYPES", "softplus", "inv_l2norm", "gdn_gate", "interpreting", "fail",
           "check_slots", "check_meta"]

# the float dtypes of every kernel's inputs, outputs and pools (decode also reads fp64 inputs)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------------------------
# Triton helpers
# --------------------------------------------------------------------------------------------

@triton.jit
def softplus(x):
    """log(1 + exp(x)) in fp32, with torch's threshold (x > 20 -> x), which also keeps exp() from
    overflowing. The same form as vLLM's fused_gdn_gating (beta 1, threshold 20)."""
    return tl.where(x > 20., x, tl.log(1. + tl.exp(tl.minimum(x, 20.))))


@triton.jit
def inv_l2norm(x, AXIS: tl.constexpr):
    """rsqrt(sum(x^2) + 1e-6) over ``AXIS``: x times it is reference.l2norm(x) (same eps, same
    placement). The factor rather than the product, so each caller keeps its own order of
    multiplication with the q scale, on which its recorded bits depend."""
    return tl.rsqrt(tl.sum(x * x, AXIS) + 1e-6)


@triton.jit
def gdn_gate(b_a, b_b, neg_A, dt_bias):
    """Log decay g = neg_A * softplus(a + dt_bias) and write strength beta = sigmoid(b), fp32.
    ``neg_A`` is -exp(A_log), computed by the caller once per head."""
    g = neg_A * softplus(b_a + dt_bias)
    beta = 1. / (1. + tl.exp(-b_b))
    return g, beta


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------

def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (the CPU test tier)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def fail(fn: str, msg: str):
    """Raise the ValueError of a failed check on the arguments of public function ``fn``."""
    raise ValueError(f"{fn}: {msg}")


def check_slots(fn: str, name: str, t, n: int, device, *, ref: str, ndim: int = 1):
    """``t`` is an int32 table with ``ndim`` dims, at least ``n`` rows, contiguous along its last
    dim, on ``device`` (the device of argument ``ref``)."""
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        fail(fn, f"{name} must be a {ndim}-d int32 tensor, got {getattr(t, 'shape', type(t))}")
    if t.dtype != torch.int32:
        fail(fn, f"{name} must be int32, got {t.dtype}")
    if t.shape[0] < n:
        fail(fn, f"{name} has {t.shape[0]} {'rows' if ndim > 1 else 'entries'}, need at least {n}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(fn, f"{name} must be contiguous along its last dim, got strides {t.stride()}")
    if t.device != device:
        fail(fn, f"{name} is on {t.device}, {ref} is on {device}")


def check_meta(fn: str, meta, device, *, ref: str):
    """``meta`` is a ChunkMeta whose tables are int32, 1-D, contiguous and on ``device``, with
    max_seqs entries (cu_seqlens and ckpt_offsets: max_seqs + 1), chunk_idx as long as chunk_seq,
    at least one ckpt_slots entry, and a block size that is a positive multiple of CHUNK."""
    if not isinstance(meta, ChunkMeta):
        fail(fn, f"meta must be a ChunkMeta, got {type(meta).__name__}")
    for name in ChunkMeta.tensor_fields():
        t = getattr(meta, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
            fail(fn, f"meta.{name} must be a 1-D int32 tensor")
        if t.shape[0] > 1 and t.stride(0) != 1:
            fail(fn, f"meta.{name} must be contiguous")
        if t.device != device:
            fail(fn, f"meta.{name} is on {t.device}, {ref} is on {device}")
    ms = meta.max_seqs
    for name, size in (("cu_seqlens", ms + 1), ("start_pos", ms), ("write_slot", ms),
                       ("ckpt_offsets", ms + 1), ("chunk_idx", meta.max_chunks)):
        if getattr(meta, name).shape[0] != size:
            fail(fn, f"meta.{name} must have {size} entries, has {getattr(meta, name).shape[0]}")
    if meta.ckpt_slots.shape[0] < 1:
        fail(fn, "meta.ckpt_slots must hold at least one entry")
    if not isinstance(meta.block_size, int) or meta.block_size <= 0 or meta.block_size % CHUNK:
        fail(fn, f"meta.block_size must be a positive multiple of {CHUNK}, got {meta.block_size}")
