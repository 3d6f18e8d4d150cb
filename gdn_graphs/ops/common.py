"""What the kernels of decode.py, chunk.py and conv.py share: Triton helpers and host-side checks.

Triton helpers (inlined into the kernels that call them):
    softplus       torch's softplus with its threshold (x > 20 -> x)
    inv_l2norm     the factor rsqrt(sum x^2 + 1e-6) that l2-normalises x (as reference.l2norm)
    gdn_gate       the GDN gates: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
    cast_like_gpu  x.to(dtype) rounding to nearest even, also under the interpreter
    dot_like_gpu   tl.dot, with 16-bit operands widened under the interpreter
    clip_span      a sequence's span clipped to the tensors
    clip_pos       a start position clipped to [0, MAX_POS)
    span_chunks    the 64-token chunks (aligned to absolute positions) a span touches
    slot_ok        whether a slot value names a slot of the pool (0 <= slot < num_slots)
    bad_slot       whether a slot value is neither a slot of the pool nor NO_SLOT
    report         OR an error code into the caller's error flag (nothing without one)

Error flag (``error_flag=``, an optional int32 tensor of at least one element that every kernel
takes; the GDN core passes ``GDNStep.error_flag``). The kernels never touch memory outside the
tensors they are given, whatever the slot values and metadata: a slot outside [-1, num_slots) is
treated exactly like NO_SLOT, and token spans are clipped to the tensors. Each such repair ORs a
code into ``error_flag[0]`` on the device (no sync; graph-safe); the caller reads it after the
step. The flag is never cleared by a kernel: whoever owns it zeroes it (GDNPlanner.plan()).
    ERR_SLOT    1  a read, write or checkpoint slot outside [-1, num_slots): nothing was read
                   or stored there (as NO_SLOT)
    ERR_TOKENS  2  token metadata outside the tensors: a span of cu_seqlens past T, negative or
                   decreasing, or start_pos outside [0, MAX_POS): the span was clipped
    ERR_META    4  a chunk or checkpoint table entry outside its table or inconsistent with the
                   spans (chunk_seq past max_seqs, chunk_idx past the sequence's chunks,
                   ckpt_offsets outside ckpt_slots or not matching the span): skipped

Host side (metadata only: no device sync, no allocation):
    FLOAT_DTYPES   the float dtypes every kernel takes (fp16, bf16, fp32)
    interpreting   whether kernels run under the Triton interpreter (TRITON_INTERPRET=1)
    fail           the ValueError of a failed check, "<function>: <message>"
    check_slots    an int32 slot (or offset) table: dims, length, contiguity, device
    check_meta     a ChunkMeta: int32 1-D contiguous tables of consistent lengths, block size,
                   and its host token count (when it has one) within the tensors
    check_flag     an error flag: int32, at least one element, on the inputs' device
    error_names    the causes that a flag value holds, as words
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.meta import ChunkMeta

__all__ = ["cast_like_gpu", "dot_like_gpu", "FLOAT_DTYPES", "ERR_SLOT", "ERR_TOKENS", "ERR_META", "ERR_SLOT_C", "ERR_TOKENS_C",
           "ERR_META_C", "MAX_POS", "softplus", "inv_l2norm", "gdn_gate", "clip_span", "clip_pos",
           "span_chunks", "slot_ok", "bad_slot", "report", "interpreting", "fail", "check_slots",
           "check_meta", "check_flag", "error_names"]

# the float dtypes of every kernel's inputs, outputs and pools (decode also reads fp64 inputs)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# error flag codes (bits; see the module docstring)
ERR_SLOT = 1
ERR_TOKENS = 2
ERR_META = 4
_ERR_NAMES = {ERR_SLOT: "slot out of range", ERR_TOKENS: "tokens beyond the tensors",
              ERR_META: "chunk or checkpoint table inconsistent"}
# the same codes as Triton constants (a kernel may read only constexpr globals)
ERR_SLOT_C, ERR_TOKENS_C, ERR_META_C = (tl.constexpr(c) for c in (ERR_SLOT, ERR_TOKENS, ERR_META))
# Positions (start_pos) are clipped to [0, MAX_POS) and token counts T must stay below it, so no
# position arithmetic of the prefill kernels overflows int32 (n + T < 2^31).
MAX_POS = 2 ** 30


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
def cast_like_gpu(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """x.to(dtype), rounding to nearest even like the GPU does. (The interpreter truncates fp32 to
    bf16; round the mantissa by hand there so the CPU tier sees the GPU's bf16 arithmetic.)"""
    if INTERPRET and dtype == tl.bfloat16 and x.dtype == tl.float32:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def dot_like_gpu(a, b, acc, PREC: tl.constexpr, INTERPRET: tl.constexpr):
    """tl.dot; under the interpreter 16-bit operands are widened first (its bf16 dot is broken).
    bf16 x bf16 products are exact in fp32, so this emulates the tensor-core arithmetic."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc=acc, input_precision=PREC)


@triton.jit
def gdn_gate(b_a, b_b, neg_A, dt_bias):
    """Log decay g = neg_A * softplus(a + dt_bias) and write strength beta = sigmoid(b), fp32.
    ``neg_A`` is -exp(A_log), computed by the caller once per head."""
    g = neg_A * softplus(b_a + dt_bias)
    beta = 1. / (1. + tl.exp(-b_b))
    return g, beta


@triton.jit
def slot_ok(slot, num_slots):
    """Whether ``slot`` names a slot of the pool: only then is it dereferenced."""
    return (slot >= 0) & (slot < num_slots)


@triton.jit
def bad_slot(slot, num_slots):
    """Whether ``slot`` is neither a pool slot nor NO_SLOT (-1): an ERR_SLOT."""
    return (slot < -1) | (slot >= num_slots)


_MAX_POS = tl.constexpr(MAX_POS)


@triton.jit
def clip_span(bos0, eos0, T):
    """A sequence's flat span [bos0, eos0) clipped to the tensors' [0, T) (never decreasing):
    (bos, eos, whether that changed it). Valid metadata passes unchanged; a clipped span keeps
    every token index inside the tensors and every loop over it within T."""
    bos = tl.minimum(tl.maximum(bos0, 0), T)
    eos = tl.minimum(tl.maximum(eos0, bos), T)
    return bos, eos, (bos != bos0) | (eos != eos0)


@triton.jit
def clip_pos(n0):
    """A start position clipped to [0, MAX_POS): (n, whether that changed it). With T < MAX_POS
    too, no position arithmetic of a prefill kernel overflows int32."""
    n = tl.minimum(tl.maximum(n0, 0), _MAX_POS - 1)
    return n, n != n0


@triton.jit
def span_chunks(n, q, BC: tl.constexpr):
    """Chunks of BC (aligned to absolute positions) that q >= 0 tokens from position n touch."""
    return tl.where(q > 0, (n + q - 1) // BC - n // BC + 1, 0)


@triton.jit
def report(error_flag, bad, CODE: tl.constexpr, HAS_FLAG: tl.constexpr):
    """OR ``CODE`` into error_flag[0] when the scalar ``bad`` holds; compiled out without a flag.
    An atomic (so codes of several causes and kernels add up), relaxed (no fence), and only on
    the bad path: a valid launch executes a compare and a branch, no memory access."""
    if HAS_FLAG:
        if bad:
            tl.atomic_or(error_flag, CODE, sem="relaxed")


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------

def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (the CPU test tier)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _span(t):
    """[first, last + 1) bytes of the memory a tensor's elements occupy (metadata only)."""
    lo = t.data_ptr()
    return lo, lo + t.element_size() * (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())))


def overlaps(a, b) -> bool:
    """Whether two tensors' memory ranges intersect (metadata only)."""
    return first_overlap(a, {"b": b}) is not None


def first_overlap(a, others: dict):
    """The name of the first tensor of ``others`` whose memory range intersects ``a``'s, else
    None (metadata only; ``a``'s range is computed once, as callers check it per layer)."""
    if a.numel() == 0:
        return None
    a0, a1 = _span(a)
    for name, b in others.items():
        if b.numel() and b.device == a.device:
            b0, b1 = _span(b)
            if a0 < b1 and b0 < a1:
                return name
    return None


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


def check_meta(fn: str, meta, device, T: int, *, ref: str):
    """``meta`` is a ChunkMeta whose tables are int32, 1-D, contiguous and on ``device``, with
    max_seqs entries (cu_seqlens and ckpt_offsets: max_seqs + 1), chunk_idx as long as chunk_seq,
    at least one ckpt_slots entry, and a block size that is a positive multiple of CHUNK; the
    launch's ``T`` tokens (of argument ``ref``) are below MAX_POS and, when the meta was built on
    the host, hold its tokens (``meta.num_tokens``; the device values are never read)."""
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
    if meta.block_size >= MAX_POS:
        fail(fn, f"meta.block_size must be below {MAX_POS}, got {meta.block_size}")
    if T >= MAX_POS:
        fail(fn, f"{T} tokens: a launch takes fewer than {MAX_POS}")
    if meta.num_seqs is not None and meta.num_seqs > ms:
        fail(fn, f"meta holds {meta.num_seqs} sequences, its buffers {ms}")
    if meta.num_tokens is not None and meta.num_tokens > T:
        fail(fn, f"meta covers {meta.num_tokens} tokens, {ref} holds {T}")


def check_flag(fn: str, flag, device, *, ref: str):
    """``flag`` is None or an int32 tensor with at least one element on ``device``."""
    if flag is None:
        return
    if not isinstance(flag, torch.Tensor) or flag.dtype != torch.int32 or flag.numel() < 1:
        fail(fn, f"error_flag must be an int32 tensor of at least one element, got "
             f"{getattr(flag, 'dtype', type(flag))} {tuple(getattr(flag, 'shape', ()))}")
    if flag.device != device:
        fail(fn, f"error_flag is on {flag.device}, {ref} is on {device}")


def error_names(code: int) -> list[str]:
    """The causes held by an error flag value (empty for 0), e.g. ["slot out of range"]."""
    names = [name for bit, name in _ERR_NAMES.items() if code & bit]
    rest = code & ~sum(_ERR_NAMES)
    return names + ([f"unknown code {rest}"] if rest else [])
