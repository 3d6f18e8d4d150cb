"""Fused GatedDeltaNet decode: gating, q/k L2 norm and the state update in one Triton kernel.

The state lives in a pool ``ssm[num_slots, HV, V, K]`` (K contiguous). Each row of the batch names
the slot it reads its state from and the slot(s) it writes the updated state to; the two may differ
(a step that crosses a block boundary writes the next block's slot, no copy) or be equal (in place).
Slot ``-1`` (``NO_SLOT``) is never dereferenced: read -1 starts from a zero state, write -1 stores
nothing. The slot conventions are the README's ("Conventions").

Two public functions share one kernel:
    gdn_decode        one token per row (plain decode); a row with both slots -1 is padding and
                      gets a zero output without doing any math
    gdn_decode_multi  a varlen batch of a few tokens per row (``cu_seqlens``), the state kept in
                      registers across the row's tokens (rounded to the pool's dtype after each,
                      as a token-by-token run through gdn_decode would see it) and optionally
                      stored after every token (speculative rows); rows with 0 tokens are padding

Grid: ``N * HV * cdiv(V, BV)`` programs in one flat axis, a row's tiles fastest. Program
``i * HV * cdiv(V, BV) + j`` owns the ``[BV, K]`` tile of row i's state for value head
``j // cdiv(V, BV)``: the tile is read once and written once, and since every row of S only needs
the full q and k of its key head (not other rows of S), tiles are independent. K is kept whole in
one program so the reductions over K (S @ k, S @ q) never leave the program. The order is for
DRAM: programs that run together read and write neighbouring tiles of one state, as a copy kernel
does, where with the row fastest they touch tiles one slot stride apart.

Nothing in the launchers synchronises, allocates (except ``out`` when it is None) or looks at tensor
values, so both functions can be captured in CUDA graphs. Shapes, dtypes and strides are checked up
front (metadata only); slot *values* are the planner's responsibility: the write slots of a launch
must be distinct and no row may read a slot that another row writes.

Memory safety does not rest on the values: a slot outside [-1, num_slots) is treated as -1 (never
dereferenced) and a row's tokens are clipped to [0, T) (gdn_decode_multi), and each such repair
sets a code in the optional ``error_flag`` (gdn_graphs.ops.common). With programmatic dependent
launch the flag is written only after ``gdc_wait()``, like everything else the kernel writes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.common import (ERR_SLOT_C, ERR_TOKENS_C, FLOAT_DTYPES, bad_slot,
                                   check_flag, check_slots, clip_span, fail, gdn_gate,
                                   interpreting, inv_l2norm, report, slot_ok)

__all__ = ["gdn_decode", "gdn_decode_multi", "default_config", "pdl_supported"]

# the kernel dereferences only slots in [0, num_slots); any other value reads as NO_SLOT, and
# anything but -1 among them is reported (common.bad_slot)
assert NO_SLOT == -1

_INPUT_DTYPES = FLOAT_DTYPES + (torch.float64,)  # fp64 inputs are read as fp32


# --------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------

@triton.jit
def _load_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t, i_hk, i_hv, neg_A, dt_bias,
                stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
                o_k, o_v, mask_k, mask_v, scale,
                HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HK: tl.constexpr):
    """Token t's inputs for one value head, in fp32: l2-normalised (scaled) q and k [BK], the
    [BV] slice of v, the log decay g and the write strength beta."""
    t64 = t.to(tl.int64)
    b_q = tl.load(q_ptr + t64 * stride_qt + i_hk * K + o_k, mask=mask_k, other=0.).to(tl.float32)
    b_k = tl.load(k_ptr + t64 * stride_kt + i_hk * K + o_k, mask=mask_k, other=0.).to(tl.float32)
    b_v = tl.load(v_ptr + t64 * stride_vt + i_hv * V + o_v, mask=mask_v, other=0.).to(tl.float32)
    b_a = tl.load(a_ptr + t64 * stride_at + i_hv).to(tl.float32)
    b_b = tl.load(b_ptr + t64 * stride_bt + i_hv).to(tl.float32)
    b_q = b_q * inv_l2norm(b_q, 0) * scale
    b_k = b_k * inv_l2norm(b_k, 0)
    g, beta = gdn_gate(b_a, b_b, neg_A, dt_bias)
    return b_q, b_k, b_v, g, beta


@triton.jit
def _delta_step(b_h, b_q, b_k, b_v, g, beta):
    """One GDN token on a [BV, BK] fp32 state tile: decay, delta-rule write, read out o [BV]."""
    b_h = b_h * tl.exp(g)
    b_u = beta * (b_v - tl.sum(b_h * b_k[None, :], axis=1))
    b_h = b_h + b_u[:, None] * b_k[None, :]
    b_o = tl.sum(b_h * b_q[None, :], axis=1)
    return b_h, b_o


@triton.jit
def _wait_for_previous_kernel():
    """Programmatic dependent launch: everything above this call may overlap the previous kernel
    in the stream, everything below sees all of its writes. Above it the kernel reads only what no
    kernel of the same step writes: the slot tables (copied in before the step), the layer's
    weights and its own pool's read slots (written by this layer in an earlier step). Then let the
    next kernel start its own prologue; it waits in turn before reading anything we write."""
    gdc_wait()
    gdc_launch_dependents()


# Not specialised on: Tmax (the width of a write-slot table), T (the step's token count) and
# num_slots (the pool's size): they depend on the engine, not the model (see chunk.py).
@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_FLAG": lambda args: args["error_flag"] is not None,
    "BK": lambda args: triton.next_power_of_2(args["K"]),
})
@triton.jit(do_not_specialize=["Tmax", "T", "num_slots"])
def _gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    ssm_ptr, o_ptr,
    cu_seqlens, read_slot_ptr, write_slot_ptr, error_flag,
    stride_qt, stride_kt, stride_vt, stride_at, stride_bt, stride_ot,
    stride_slot, stride_w_slot, Tmax, T, num_slots,
    scale,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr, USE_PDL: tl.constexpr,
    HAS_FLAG: tl.constexpr, NSUB: tl.constexpr = 1,
):
    # a program owns NSUB consecutive [BV, K] tiles of one head (NSUB > 1: one-token rows only)
    tl.static_assert((NSUB == 1) or (not IS_VARLEN))
    NV: tl.constexpr = (V + BV * NSUB - 1) // (BV * NSUB)
    # one flat grid, a row's tiles fastest: programs launched together stream neighbouring
    # tiles of one state, as a copy does (with the row fastest they read tiles one slot stride
    # apart, a large power of two: fewer DRAM channels busy; module docstring)
    pid = tl.program_id(0)
    i_n = pid // (HV * NV)
    i_j = pid % (HV * NV)
    i_hv = i_j // NV
    i_v = i_j % NV
    i_hk = i_hv // (HV // HK)

    o_k = tl.arange(0, BK)
    o_v = i_v * (BV * NSUB) + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    # offsets of this program's [BV, BK] tile inside one slot
    o_h = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]

    # per-head constants; independent of the slots, so they load alongside them
    neg_A = -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    r_slot = tl.load(read_slot_ptr + i_n)
    # never form an address from a slot outside the pool (-1 or bad): use slot 0, mask the access
    r_ok = slot_ok(r_slot, num_slots)
    p_read = ssm_ptr + tl.where(r_ok, r_slot, 0).to(tl.int64) * stride_slot + o_h

    if IS_VARLEN:
        # the row's tokens clipped to the tensors' [0, T) (no change for valid metadata): every
        # token index below is inside q, k, v, a, b and out, and the loop runs at most T times
        bos, eos, clipped = clip_span(tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1), T)
        # state is loaded once; a 0-token row skips the loop and touches nothing else
        b_h = tl.load(p_read, mask=mask_h & r_ok & (eos > bos), other=0.).to(tl.float32)
        if USE_PDL:
            _wait_for_previous_kernel()
        # (the flag, like every write, only after the wait)
        report(error_flag, bad_slot(r_slot, num_slots), ERR_SLOT_C, HAS_FLAG)
        report(error_flag, clipped, ERR_TOKENS_C, HAS_FLAG)
        # a while loop, not range(bos, eos): runtime trip counts the same on the GPU, and the
        # Triton interpreter under numpy >= 2 cannot turn a loaded scalar into a range bound
        t = bos
        while t < eos:
            b_q, b_k, b_v, g, beta = _load_token(
                q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t, i_hk, i_hv, neg_A, dt_bias,
                stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
                o_k, o_v, mask_k, mask_v, scale, HV, K, V, HK)
            b_h, b_o = _delta_step(b_h, b_q, b_k, b_v, g, beta)
            tl.store(o_ptr + t.to(tl.int64) * stride_ot + i_hv * V + o_v,
                     b_o.to(o_ptr.dtype.element_ty), mask=mask_v)
            # write_slots[i, t - bos]; an entry past the row's width means "no slot"
            i_t = t - bos
            w_slot = tl.load(write_slot_ptr + i_n.to(tl.int64) * stride_w_slot + i_t,
                             mask=i_t < Tmax, other=-1)
            w_ok = slot_ok(w_slot, num_slots)
            p_write = ssm_ptr + tl.where(w_ok, w_slot, 0).to(tl.int64) * stride_slot + o_h
            # the state continues as the pool holds it (a no-op for fp32 pools): each token does
            # exactly what gdn_decode does to a state it reads from the pool
            b_h = b_h.to(p_write.dtype.element_ty)
            tl.store(p_write, b_h, mask=mask_h & w_ok)
            b_h = b_h.to(tl.float32)
            report(error_flag, bad_slot(w_slot, num_slots), ERR_SLOT_C, HAS_FLAG)
            t += 1
    else:
        w_slot = tl.load(write_slot_ptr + i_n)
        w_ok = slot_ok(w_slot, num_slots)
        p_o = o_ptr + i_n.to(tl.int64) * stride_ot + i_hv * V + o_v
        # issue the big state load first (masked off, it costs nothing for a padded row)
        b_h = tl.load(p_read, mask=mask_h & r_ok, other=0.).to(tl.float32)
        if USE_PDL:
            _wait_for_previous_kernel()
        # (the flag, like every write, only after the wait)
        report(error_flag, bad_slot(r_slot, num_slots) | bad_slot(w_slot, num_slots), ERR_SLOT_C,
               HAS_FLAG)
        if r_ok | w_ok:
            b_q, b_k, b_v, g, beta = _load_token(
                q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_n, i_hk, i_hv, neg_A, dt_bias,
                stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
                o_k, o_v, mask_k, mask_v, scale, HV, K, V, HK)
            p_write = ssm_ptr + tl.where(w_ok, w_slot, 0).to(tl.int64) * stride_slot + o_h
            # Tile s covers rows o_v + s * BV. Its successor's state load is issued before its
            # math, so a program keeps a tile in flight while it computes (more bytes in flight
            # per register than one tile a program); q, k and the gates are loaded once for all.
            for s in tl.static_range(NSUB):
                m_v = (o_v + s * BV) < V
                m_h = m_v[:, None] & mask_k[None, :]
                if s + 1 < NSUB:
                    m_next = ((o_v + (s + 1) * BV) < V)[:, None] & mask_k[None, :]
                    b_next = tl.load(p_read + (s + 1) * BV * K, mask=m_next & r_ok, other=0.)
                if s > 0:
                    b_v = tl.load(v_ptr + i_n.to(tl.int64) * stride_vt + i_hv * V + o_v + s * BV,
                                  mask=m_v, other=0.).to(tl.float32)
                b_h, b_o = _delta_step(b_h, b_q, b_k, b_v, g, beta)
                tl.store(p_write + s * BV * K, b_h.to(p_write.dtype.element_ty), mask=m_h & w_ok)
                tl.store(p_o + s * BV, b_o.to(p_o.dtype.element_ty), mask=m_v)
                if s + 1 < NSUB:
                    b_h = b_next.to(tl.float32)
        else:
            # padded row: no slot to read or write, output is exactly zero
            for s in tl.static_range(NSUB):
                tl.store(p_o + s * BV, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty),
                         mask=(o_v + s * BV) < V)


# --------------------------------------------------------------------------------------------
# configuration and checks (host side, metadata only)
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)  # runs on every launch: keep it off the host's critical path
def default_config(K: int, V: int, N: int, state_dtype: torch.dtype = torch.float32):
    """Default (BV, num_warps, nsub) for a launch of ``N`` one-token rows, from the shapes only.

    A program streams its state tiles in and out; the launch is memory-bound, so what counts is
    the bytes each program keeps in flight: ~4 KiB per program, as ``nsub`` tiles of ~1024
    elements with one warp (~32 elements per thread), the next tile's load issued while one is
    computed. So an fp32 pool takes one [8, 128] tile per program and a bf16 pool two (with one
    bf16 tile per program, the bytes in flight halve: 74% of the copy bandwidth at B = 64 against
    85% with two). Below 16 rows a ~2 KiB tile (BV <= 4), one per program, so that enough
    programs fill the SMs. (Measurements on an H200: profiling/results/2026-11-29/SUMMARY.md and
    2026-12-01/SUMMARY.md, the (BV, num_warps, nsub) sweeps.)
    """
    BK = triton.next_power_of_2(K)
    BV = max(1, min(triton.next_power_of_2(V), 1024 // BK))
    if N < 16:
        return max(1, min(BV, 4)), 1, 1
    num_warps = max(1, min(8, (BV * BK) // 1024))     # ~32 state elements per thread
    tile_bytes = BV * BK * state_dtype.itemsize
    nsub = max(1, min(4096 // tile_bytes, triton.cdiv(V, BV)))
    return BV, num_warps, 1 << (nsub.bit_length() - 1)   # a power of two


# the checks of both public functions; every message starts "gdn_decode: "
_fail = functools.partial(fail, "gdn_decode")
_check_slots = functools.partial(check_slots, "gdn_decode", ref="q")


def _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, out):
    """Shape/dtype/stride checks shared by both forms; returns (T, HK, HV, K, V)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _fail(f"{name} must be a 3-d tensor [tokens, heads, dim], got "
                  f"{getattr(t, 'shape', type(t))}")
        if t.dtype not in _INPUT_DTYPES:
            _fail(f"{name} must be a float tensor ({_INPUT_DTYPES}), got {t.dtype}")
        if t.stride(2) != 1 or (t.shape[1] > 1 and t.stride(1) != t.shape[2]):
            _fail(f"{name} must have a contiguous last dim and head stride == head dim, got "
                  f"shape {tuple(t.shape)} strides {t.stride()}")
    if q.shape != k.shape:
        _fail(f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        _fail(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    T, HK, K = q.shape
    if v.shape[0] != T:
        _fail(f"v has {v.shape[0]} tokens, q has {T}")
    HV, V = v.shape[1], v.shape[2]
    if HK == 0 or HV % HK != 0:
        _fail(f"HV ({HV}) must be a positive multiple of HK ({HK})")
    if K == 0 or V == 0:
        _fail(f"head dims must be positive, got K={K}, V={V}")
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or tuple(t.shape) != (T, HV):
            _fail(f"{name} must be [{T}, {HV}], got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _INPUT_DTYPES:
            _fail(f"{name} must be a float tensor, got {t.dtype}")
        if HV > 1 and t.stride(1) != 1:
            _fail(f"{name} must be contiguous along heads, got strides {t.stride()}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != HV:
            _fail(f"{name} must be [{HV}], got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _INPUT_DTYPES:  # read as fp32 in the kernel (vLLM keeps dt_bias in bf16)
            _fail(f"{name} must be a float tensor ({_INPUT_DTYPES}), got {t.dtype}")
        if HV > 1 and t.stride(0) != 1:
            _fail(f"{name} must be contiguous")
    if not isinstance(ssm, torch.Tensor) or ssm.dim() != 4:
        _fail("ssm must be a 4-d pool [num_slots, HV, V, K], got "
              f"{getattr(ssm, 'shape', type(ssm))}")
    if tuple(ssm.shape[1:]) != (HV, V, K):
        _fail(f"ssm must be [num_slots, {HV}, {V}, {K}], got {tuple(ssm.shape)}")
    if ssm.dtype not in FLOAT_DTYPES:
        _fail(f"ssm must be float32, bfloat16 or float16, got {ssm.dtype}")
    if ssm.stride(3) != 1 or ssm.stride(2) != K or ssm.stride(1) != V * K:
        _fail(f"ssm inner dims [HV, V, K] must be contiguous, got strides {ssm.stride()}")
    if ssm.shape[0] > 1 and ssm.stride(0) < HV * V * K:
        _fail(f"ssm slot stride {ssm.stride(0)} is smaller than a state ({HV * V * K})")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (T, HV, V):
            _fail(f"out must be [{T}, {HV}, {V}], got {getattr(out, 'shape', type(out))}")
        if out.dtype != v.dtype:
            _fail(f"out must have v's dtype {v.dtype}, got {out.dtype}")
        if out.stride(2) != 1 or (HV > 1 and out.stride(1) != V):
            _fail(f"out must have a contiguous last dim and head stride V, got {out.stride()}")
    dev = q.device
    for name, t in (("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log),
                    ("dt_bias", dt_bias), ("ssm", ssm), ("out", out)):
        if t is not None and t.device != dev:
            _fail(f"{name} is on {t.device}, q is on {dev}")
    return T, HK, HV, K, V


@functools.lru_cache(maxsize=None)
def pdl_supported(dev: torch.device) -> bool:
    """Whether ``pdl=True`` can be used on ``dev``: a CUDA (not ROCm) device of compute capability
    9.0 or newer, and kernels not run by the Triton interpreter."""
    return (dev.type == "cuda" and torch.version.hip is None
            and not interpreting()
            and torch.cuda.get_device_capability(dev) >= (9, 0))


def _check_pdl(pdl, dev):
    if pdl and not pdl_supported(dev):
        _fail(f"pdl=True needs a CUDA device of compute capability 9.0 or newer (and no Triton "
              f"interpreter), got {dev}")


def _resolve_config(K, V, N, ssm, BV, num_warps, nsub):
    """The launch's (BV, num_warps, nsub): the defaults where None; a tile chosen by hand (BV or
    num_warps given) is one tile per program unless nsub says otherwise."""
    dBV, dnw, dns = default_config(K, V, N, ssm.dtype)
    if nsub is None:
        nsub = dns if BV is None and num_warps is None else 1
    BV = dBV if BV is None else BV
    num_warps = dnw if num_warps is None else num_warps
    for name, x in (("BV", BV), ("num_warps", num_warps), ("nsub", nsub)):
        if not isinstance(x, int) or x < 1 or x & (x - 1):
            _fail(f"{name} must be a power of two, got {x!r}")
    return BV, num_warps, nsub


# --------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------

def _launch(q, k, v, a, b, A_log, dt_bias, ssm, out, cu_seqlens, read_slot, write_slots,
            write_stride, write_width, N, scale, BV, num_warps, pdl, error_flag, nsub=1):
    """One launch of the kernel over N rows; checks already done, nothing here syncs.

    cu_seqlens None: row i is token i and writes write_slots[i] (write_stride, write_width 1).
    Else row i is tokens cu_seqlens[i] .. cu_seqlens[i+1] and its token t writes
    write_slots[i, t] (a [>= N, write_width] table of row stride write_stride). Mutates ``out``
    and the write slots of ``ssm``.
    """
    if N == 0:
        return out
    HK, K = q.shape[1], q.shape[2]
    HV, V = v.shape[1], v.shape[2]
    scale = K ** -0.5 if scale is None else float(scale)
    grid = (N * HV * triton.cdiv(V, BV * nsub),)
    _gdn_decode_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, ssm, out,
        cu_seqlens, read_slot, write_slots, error_flag,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), out.stride(0),
        ssm.stride(0), write_stride, write_width, q.shape[0], ssm.shape[0],
        scale,
        HK=HK, HV=HV, K=K, V=V, BV=BV, USE_PDL=pdl, NSUB=nsub, num_warps=num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def gdn_decode(q, k, v, a, b, A_log, dt_bias, ssm, read_slot, write_slot, out=None, scale=None,
               *, BV=None, num_warps=None, pdl=False, error_flag=None, nsub=None):
    """One GDN decode token per row, state read from and written to a slot pool.

    Args:
        q, k:        [N, HK, K] float (bf16/fp16/fp32/fp64); last dim contiguous, head stride K,
                     token stride arbitrary (views into a packed qkv tensor are fine).
        v:           [N, HV, V], same dtype and layout rules; HV is a multiple of HK and value
                     head h uses key head h // (HV // HK).
        a, b:        [N, HV] gate inputs (any float dtype, row stride arbitrary).
        A_log, dt_bias: [HV] float (read as fp32). g = -exp(A_log) * softplus(a + dt_bias),
                     beta = sigmoid(b).
        ssm:         [num_slots, HV, V, K] float32 / bfloat16 / float16 pool; inner dims contiguous,
                     slot stride may exceed HV*V*K. All math is fp32, cast on store. MUTATED: the
                     write slots.
        read_slot, write_slot: int32 [>= N] device tensors. Row i starts from ssm[read_slot[i]]
                     (-1: zeros) and stores its new state to ssm[write_slot[i]] (-1: nothing).
                     Both -1: padded row, output exactly zero. read == write works (in place).
                     A value outside [-1, num_slots) is treated as -1 and reported (ERR_SLOT).
                     Write slots must be distinct and read by no other row (not checked here:
                     the planner's rule).
        out:         optional [N, HV, V] in v's dtype (last dim contiguous, head stride V);
                     every element is written. Allocated when None.
        scale:       q scale after l2norm, default K ** -0.5.
        BV, num_warps: tile height and warps per program (defaults: ``default_config``).
        nsub:        [BV, K] tiles per program (a power of two), each one's successor loaded
                     while it is computed (default: ``default_config``'s, or 1 when BV or
                     num_warps is given). The same arithmetic per row whatever nsub: outputs and
                     states are bit-identical to one tile per program with that BV, num_warps.
        pdl:         launch with programmatic dependent launch (CUDA, sm_90+): the slot and state
                     loads overlap the previous kernel in the stream, and the next kernel may
                     start before this one ends. Requires that the kernel just before this one
                     does not write this launch's read slots (true when each layer owns its
                     pool). Pays off for back-to-back small launches, e.g. batch 1 in a graph.
        error_flag:  optional int32 [>= 1] tensor; the kernel ORs gdn_graphs.ops.common's codes
                     into element 0 (ERR_SLOT here), after its PDL wait. Never cleared here.
    Returns ``out``. Never synchronises; safe to capture in a CUDA graph.
    """
    N, HK, HV, K, V = _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, out)
    _check_pdl(pdl, q.device)
    check_flag("gdn_decode", error_flag, q.device, ref="q")
    _check_slots("read_slot", read_slot, N, q.device)
    _check_slots("write_slot", write_slot, N, q.device)
    BV, num_warps, nsub = _resolve_config(K, V, N, ssm, BV, num_warps, nsub)
    if out is None:
        out = torch.empty(N, HV, V, dtype=v.dtype, device=v.device)
    return _launch(q, k, v, a, b, A_log, dt_bias, ssm, out, None, read_slot, write_slot, 1, 1,
                   N, scale, BV, num_warps, pdl, error_flag, nsub=nsub)


def gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, ssm, cu_seqlens, read_slot, write_slots,
                     out=None, scale=None, *, BV=None, num_warps=None, pdl=False, error_flag=None):
    """A few GDN tokens per row (varlen), state kept in registers across each row's tokens.

    Args:
        q, k [T, HK, K], v [T, HV, V], a, b [T, HV], A_log, dt_bias [HV], ssm, scale, BV,
        num_warps, pdl: as in ``gdn_decode`` (T is the total token count of the batch).
        cu_seqlens:  int32 [N + 1]; row i owns tokens cu_seqlens[i] .. cu_seqlens[i+1]. A row with
                     0 tokens is padding and touches nothing (no output rows belong to it).
                     Spans are clipped to [0, T) on the device (ERR_TOKENS when that changes
                     one): no token outside the tensors is read or written.
        read_slot:   int32 [>= N]; row i starts from ssm[read_slot[i]] (-1: zeros).
        write_slots: int32 [>= N, Tmax]; entry [i, t] receives the state after token t of row i
                     (-1: not stored). Tokens past Tmax store nothing. MUTATES those ssm slots.
        out:         optional [T, HV, V] in v's dtype; the rows of every token are written.
        error_flag:  as in ``gdn_decode`` (ERR_SLOT, ERR_TOKENS).
    Each token does exactly gdn_decode's arithmetic on the state after the previous one as the
    pool's dtype holds it, so with the same BV / num_warps the outputs and stored states equal
    a token-by-token run through gdn_decode bit for bit (fp32 and bf16 pools alike).
    Returns ``out``. Never synchronises; safe to capture in a CUDA graph.
    """
    T, HK, HV, K, V = _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, out)
    _check_pdl(pdl, q.device)
    check_flag("gdn_decode", error_flag, q.device, ref="q")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        _fail("cu_seqlens must be a 1-d int32 tensor [N + 1]")
    N = cu_seqlens.shape[0] - 1
    _check_slots("cu_seqlens", cu_seqlens, N + 1, q.device)
    _check_slots("read_slot", read_slot, N, q.device)
    _check_slots("write_slots", write_slots, N, q.device, ndim=2)
    BV, num_warps, _ = _resolve_config(K, V, N, ssm, BV, num_warps, 1)  # one tile a program
    if out is None:
        out = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    return _launch(q, k, v, a, b, A_log, dt_bias, ssm, out, cu_seqlens, read_slot, write_slots,
                   write_slots.stride(0), write_slots.shape[1], N, scale, BV, num_warps, pdl,
                   error_flag)
