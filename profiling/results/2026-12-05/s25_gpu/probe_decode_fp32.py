"""Why is FlashInfer's fp32 pool decode 0.2-0.7 points (of copy bandwidth) ahead of ours at B >= 64?
Variants of our decode kernel, each a separate @triton.jit kernel in this file, timed beside the
library's kernel, FlashInfer's pool decode and two copies of the same state bytes.

    PYTHONPATH=. python3 profiling/results/2026-12-05/s25_gpu/probe_decode_fp32.py   # GPU, $OUT
    TRITON_INTERPRET=1 python3 probe_decode_fp32.py --cpu-check   # bits of every variant, CPU
    python3 probe_decode_fp32.py --ptx       # no GPU: compile for sm_90, registers and ld/st ops

Columns (K = V = 128, bf16 inputs, read slots != write slots, as profiling/bench_decode.py):
  lib        gdn_decode at default_config (fp32 pool, B >= 16: BV 8, 1 warp, nsub 1 = one 4 KiB
             [8, 128] tile per 32-thread program, B*HV*16 programs; bf16: BV 8, 1 warp, nsub 2)
  lib_pdl    the same with pdl=True (back-to-back launches of the graph overlap ramp and tail)
  lib_8x4x2  gdn_decode(BV=8, num_warps=4, nsub=2): FlashInfer's CTA shape (128 threads, two
             [8, 128] tiles = 8 KiB of fp32 state, B*HV*8 CTAs), the library's code
  ld_cg      library tile; state loads ld.global.cg (L2 only, no L1 allocation: FlashInfer
             loads the state with cp.async.cg)
  ld_ef      library tile; state loads with eviction_policy="evict_first" (ld.global.L1::
             evict_first.L2::cache_hint + createpolicy L2::evict_first: read lines, never
             reused, leave L2 first, the written lines stay to be drained)
  st_cs      library tile; state stores st.global.cs (streaming, evict-first)
  cg_cs      ld_cg + st_cs (state streamed both ways)
  fi_cta     lib_8x4x2 + ld_cg: FlashInfer's CTA shape and its L1-bypassing state load
  fi         FlashInfer's gated_delta_rule_decode_pretranspose (pool + initial_state_indices /
             output_state_indices; fp32: its CuTe-DSL "legacy" kernel, bf16: its bf16-state
             kernel) when flashinfer imports, else skipped with a note
  copy       torch copy_ of the B read states to the B write slots (bench_decode's copy column;
             captured as a memcpy node: above ~256 MiB bench_decode saw ~64%, not a floor)
  tcopy      a Triton slot copy on the library's grid and tile (read slot -> write slot, no
             q/k/v, no math): what the library's access pattern alone reaches

Every Triton variant does the library's arithmetic in the library's order (the one-token branch
of gdn_graphs.ops.decode._gdn_decode_kernel, its helpers imported), so its output and written
states must equal the library's at the same (BV, num_warps, nsub) bit for bit: checked on the
benchmark's first slot set of every case and on a batch with special rows (read -1, padded,
write -1); fi_cta's reference is lib_8x4x2. lib_8x4x2 against the library default is reported,
not required: with 4 warps the [128] q / k vectors of the L2 norms are spread over the warps,
so those sums are taken in another order (an H100 run: 1-ulp differences in the states).
FlashInfer: relative difference (not bitwise).

Timing follows bench_decode.py: each column is M launches over distinct slot sets (>= 1 GiB of
state touched per replay, --target-gib) captured in one CUDA graph, timed with
triton.testing.do_bench (median, L2 flushed before each replay) / M; the columns of a case are
timed in --rounds rounds (order rotated each round) and the median round is kept. Bandwidth as
bench_decode: bytes = 2*B*HV*V*K*itemsize + inputs (bench_decode.input_bytes) for decode
columns, state bytes only for the copies; % is of the device copy bandwidth measured as
bench_decode.copy_bandwidth (a 2 GiB dst.copy_(src) under do_bench; median of 3 at the start).
Pools per (TP, pool dtype) all have 2*max(B)+1 slots so that FlashInfer compiles once per
(TP, dtype) (its compile cache keys on the pool's size and strides).

Writes $OUT/probe_decode_fp32.json (or --out DIR). GPU time: 73 s on an H100 with every column,
compiles included (s25 call 2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "profiling"))

VARIANTS = ("ld_cg", "ld_ef", "st_cs", "cg_cs", "fi_cta")
COLUMNS = ("lib", "lib_pdl", "lib_8x4x2") + VARIANTS + ("fi", "copy", "tcopy")
FI_CTA = (8, 4, 2)  # (BV, num_warps, nsub): FlashInfer's CTA (8 KiB fp32, 128 threads)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="JSON directory (default $OUT or .)")
    p.add_argument("--cpu-check", action="store_true",
                   help="Triton interpreter: only the bit-equality check at a tiny B (TP 2)")
    p.add_argument("--cpu-b", type=int, default=4, help="batch of --cpu-check (default 4)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="the GPU mode's bookkeeping on the CPU (interpreter, tiny heads, K = V = 32, "
                        "wall-clock timer, no graphs, no FlashInfer): numbers mean nothing")
    p.add_argument("--ptx", action="store_true",
                   help="no GPU: compile every Triton column for sm_90, print registers and the "
                        "state ld/st instructions")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--pools", default="fp32,bf16")
    p.add_argument("--batches", default="64,256,1024")
    p.add_argument("--only", default=",".join(COLUMNS), help="columns (lib always runs)")
    p.add_argument("--no-fi-bf16", action="store_true",
                   help="skip FlashInfer with bf16 pools (its bf16 compiles take ~10 s per TP)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=10, help="do_bench warmup ms (bench --quick: 10)")
    p.add_argument("--rep", type=int, default=40, help="do_bench rep ms (bench --quick: 50)")
    p.add_argument("--target-gib", type=float, default=1.0, help="state GiB touched per replay")
    p.add_argument("--budget-gib", type=float, default=24.0, help="pool memory per case")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else parse_args([])
if ARGS.cpu_check or ARGS.cpu_dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench_decode as bd  # noqa: E402  (profiling/: inputs, bytes, bandwidth, do_bench graphs)
from gdn_graphs.ops.common import slot_ok  # noqa: E402
from gdn_graphs.ops.decode import (_delta_step, _load_token, default_config,  # noqa: E402
                                   gdn_decode, pdl_supported)

K = V = 128


# --------------------------------------------------------------------------------------------
# the variants: the one-token branch of _gdn_decode_kernel (USE_PDL False, no error flag),
# with cache / eviction knobs on the state's loads and stores
# --------------------------------------------------------------------------------------------

@triton.jit
def _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr,
          stride_qt, stride_kt, stride_vt, stride_at, stride_bt, stride_ot, stride_slot,
          num_slots, scale,
          HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
          BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr,
          LD_CM: tl.constexpr, LD_EP: tl.constexpr, ST_CM: tl.constexpr, ST_EP: tl.constexpr):
    NV: tl.constexpr = (V + BV * NSUB - 1) // (BV * NSUB)
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
    o_h = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]

    neg_A = -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    r_slot = tl.load(read_slot_ptr + i_n)
    r_ok = slot_ok(r_slot, num_slots)
    p_read = ssm_ptr + tl.where(r_ok, r_slot, 0).to(tl.int64) * stride_slot + o_h

    w_slot = tl.load(write_slot_ptr + i_n)
    w_ok = slot_ok(w_slot, num_slots)
    p_o = o_ptr + i_n.to(tl.int64) * stride_ot + i_hv * V + o_v
    b_h = tl.load(p_read, mask=mask_h & r_ok, other=0., cache_modifier=LD_CM,
                  eviction_policy=LD_EP).to(tl.float32)
    if r_ok | w_ok:
        b_q, b_k, b_v, g, beta = _load_token(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_n, i_hk, i_hv, neg_A, dt_bias,
            stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
            o_k, o_v, mask_k, mask_v, scale, HV, K, V, HK)
        p_write = ssm_ptr + tl.where(w_ok, w_slot, 0).to(tl.int64) * stride_slot + o_h
        for s in tl.static_range(NSUB):
            m_v = (o_v + s * BV) < V
            m_h = m_v[:, None] & mask_k[None, :]
            if s + 1 < NSUB:
                m_next = ((o_v + (s + 1) * BV) < V)[:, None] & mask_k[None, :]
                b_next = tl.load(p_read + (s + 1) * BV * K, mask=m_next & r_ok, other=0.,
                                 cache_modifier=LD_CM, eviction_policy=LD_EP)
            if s > 0:
                b_v = tl.load(v_ptr + i_n.to(tl.int64) * stride_vt + i_hv * V + o_v + s * BV,
                              mask=m_v, other=0.).to(tl.float32)
            b_h, b_o = _delta_step(b_h, b_q, b_k, b_v, g, beta)
            tl.store(p_write + s * BV * K, b_h.to(p_write.dtype.element_ty), mask=m_h & w_ok,
                     cache_modifier=ST_CM, eviction_policy=ST_EP)
            tl.store(p_o + s * BV, b_o.to(p_o.dtype.element_ty), mask=m_v)
            if s + 1 < NSUB:
                b_h = b_next.to(tl.float32)
    else:
        for s in tl.static_range(NSUB):
            tl.store(p_o + s * BV, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty),
                     mask=(o_v + s * BV) < V)


# one entry kernel per variant (the same arguments); the tile (BV, NSUB, num_warps) is the
# launcher's: the library default for ld_cg .. cg_cs, FI_CTA for fi_cta
@triton.jit(do_not_specialize=["num_slots"])
def _k_ld_cg(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
             read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at,
             stride_bt, stride_ot, stride_slot, num_slots, scale,
             HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr):
    _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
          stride_ot, stride_slot, num_slots, scale, HK, HV, K, V, BK, BV, NSUB,
          ".cg", "", "", "")


@triton.jit(do_not_specialize=["num_slots"])
def _k_ld_ef(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
             read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at,
             stride_bt, stride_ot, stride_slot, num_slots, scale,
             HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr):
    _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
          stride_ot, stride_slot, num_slots, scale, HK, HV, K, V, BK, BV, NSUB,
          "", "evict_first", "", "")


@triton.jit(do_not_specialize=["num_slots"])
def _k_st_cs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
             read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at,
             stride_bt, stride_ot, stride_slot, num_slots, scale,
             HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr):
    _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
          stride_ot, stride_slot, num_slots, scale, HK, HV, K, V, BK, BV, NSUB,
          "", "", ".cs", "")


@triton.jit(do_not_specialize=["num_slots"])
def _k_cg_cs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
             read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at,
             stride_bt, stride_ot, stride_slot, num_slots, scale,
             HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr):
    _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
          stride_ot, stride_slot, num_slots, scale, HK, HV, K, V, BK, BV, NSUB,
          ".cg", "", ".cs", "")


@triton.jit(do_not_specialize=["num_slots"])
def _k_fi_cta(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
              read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at,
              stride_bt, stride_ot, stride_slot, num_slots, scale,
              HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              BK: tl.constexpr, BV: tl.constexpr, NSUB: tl.constexpr):
    _body(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr, o_ptr,
          read_slot_ptr, write_slot_ptr, stride_qt, stride_kt, stride_vt, stride_at, stride_bt,
          stride_ot, stride_slot, num_slots, scale, HK, HV, K, V, BK, BV, NSUB,
          ".cg", "", "", "")


KERNELS = {"ld_cg": _k_ld_cg, "ld_ef": _k_ld_ef, "st_cs": _k_st_cs, "cg_cs": _k_cg_cs,
           "fi_cta": _k_fi_cta}


@triton.jit(do_not_specialize=["num_slots"])
def _k_slot_copy(ssm_ptr, read_slot_ptr, write_slot_ptr, stride_slot, num_slots,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                 BR: tl.constexpr):
    """[BR, K] tile of a row's state from its read slot to its write slot, the library's grid."""
    NV: tl.constexpr = (V + BR - 1) // BR
    pid = tl.program_id(0)
    i_n = pid // (HV * NV)
    i_j = pid % (HV * NV)
    i_hv = i_j // NV
    o_v = (i_j % NV) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m = (o_v < V)[:, None] & (o_k < K)[None, :]
    o_h = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    r = tl.load(read_slot_ptr + i_n)
    w = tl.load(write_slot_ptr + i_n)
    r_ok = slot_ok(r, num_slots)
    w_ok = slot_ok(w, num_slots)
    h = tl.load(ssm_ptr + tl.where(r_ok, r, 0).to(tl.int64) * stride_slot + o_h, mask=m & r_ok,
                other=0.)
    tl.store(ssm_ptr + tl.where(w_ok, w, 0).to(tl.int64) * stride_slot + o_h, h, mask=m & w_ok)


# --------------------------------------------------------------------------------------------
# makers: make(x, pool, read, write, out[B, 1, HV, V]) -> a callable (bench_decode's convention)
# --------------------------------------------------------------------------------------------

def lib_cfg(B, dtype):
    return default_config(K, V, B, dtype)


def make_variant(name, cfg, info=None):
    kern = KERNELS[name]
    BV, nw, ns = cfg

    def make(x, pool, rs, ws, out):
        o = out[:, 0]
        N = x.q.shape[0]
        grid = (N * bd.HV * triton.cdiv(V, BV * ns),)
        HK_, HV_ = bd.HK, bd.HV

        def call():
            ck = kern[grid](x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, o, rs, ws,
                            x.q.stride(0), x.k.stride(0), x.v.stride(0), x.a.stride(0),
                            x.b.stride(0), o.stride(0), pool.stride(0), pool.shape[0], K ** -0.5,
                            HK=HK_, HV=HV_, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
                            NSUB=ns, num_warps=nw)
            if info is not None and "n_regs" not in info:
                kernel_info(ck, info)
        return call
    return make


def make_tcopy(cfg, info=None):
    BV, nw, ns = cfg
    BR = BV * ns

    def make(x, pool, rs, ws, out):
        N = x.q.shape[0]
        grid = (N * bd.HV * triton.cdiv(V, BR),)
        HV_ = bd.HV

        def call():
            ck = _k_slot_copy[grid](pool, rs, ws, pool.stride(0), pool.shape[0], HV=HV_, K=K, V=V,
                                    BK=triton.next_power_of_2(K), BR=BR, num_warps=nw)
            if info is not None and "n_regs" not in info:
                kernel_info(ck, info)
        return call
    return make


def kernel_info(ck, info):
    """Registers, spills and the global ld/st opcodes of a compiled kernel (GPU only)."""
    try:
        info["n_regs"] = getattr(ck, "n_regs", None)
        info["n_spills"] = getattr(ck, "n_spills", None)
        info.update(ptx_ops(ck.asm["ptx"]))
    except Exception as e:  # noqa: BLE001 - informative only
        info["info_error"] = repr(e)[:200]


def ptx_ops(ptx):
    ops = {}
    for line in ptx.splitlines():
        m = re.search(r"\b((?:ld|st)\.global[\w:.]*)", line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    pol = sorted(set(re.findall(r"createpolicy[\w:.]*", ptx)))
    return {"ldst": ops, "policies": pol}


def columns_for(B, dtype, fi, only, pdl_ok):
    """{name: (make, reference column for the bit check or None, kind)}."""
    cfg = lib_cfg(B, dtype)
    cols = {"lib": (bd.make_ours(gdn_decode), None, "decode")}
    if "lib_pdl" in only and pdl_ok:
        cols["lib_pdl"] = (bd.make_ours(gdn_decode, pdl=True), "lib", "decode")
    if "lib_8x4x2" in only or "fi_cta" in only:
        BV, nw, ns = FI_CTA
        cols["lib_8x4x2"] = (bd.make_ours(gdn_decode, BV=BV, num_warps=nw, nsub=ns), "lib?",
                             "decode")
    for name in VARIANTS:
        if name in only:
            ref = "lib_8x4x2" if name == "fi_cta" else "lib"
            c = FI_CTA if name == "fi_cta" else cfg
            cols[name] = (make_variant(name, c, INFO.setdefault((name, str(dtype), bd.HV), {})),
                          ref, "decode")
    if fi is not None and "fi" in only and not (dtype == torch.bfloat16 and ARGS.no_fi_bf16):
        cols["fi"] = ([("", bd.make_fi(fi["fn"])),
                       ("q, k, v copied contiguous", bd.make_fi(fi["fn"], True))], "lib~", "decode")
    if "copy" in only:
        cols["copy"] = (bd.make_copy(), None, "copy")
    if "tcopy" in only:
        cols["tcopy"] = (make_tcopy(cfg, INFO.setdefault(("tcopy", str(dtype), bd.HV), {})),
                         "copy=", "copy")
    return cols


INFO = {}  # (column, dtype, HV) -> registers, spills, ld/st ops of our Triton kernels


# --------------------------------------------------------------------------------------------
# bit checks
# --------------------------------------------------------------------------------------------

def bits(t):
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


def same_bits(a, b):
    return bool(torch.equal(bits(a), bits(b)))


def run_once(make, x, pool, rs, ws, B):
    """Fill the write slots and the output with NaN, run once; (out, written states, read)."""
    wl = ws.long()[ws >= 0]
    pool[wl] = float("nan")
    out = torch.full((B, 1, bd.HV, V), float("nan"), dtype=torch.bfloat16, device=pool.device)
    make(x, pool, rs, ws, out)()
    if pool.is_cuda:
        torch.cuda.synchronize()
    return out.clone(), pool.index_select(0, wl).clone()


def check_columns(cols, x, pool, rs, ws, B):
    """Each decode column's out and written states against its reference column's, bitwise
    (FlashInfer: relative difference); tcopy: written == read states."""
    refs, res = {}, {}
    order = ["lib"] + [c for c in cols if c != "lib"]
    for name in order:
        make, ref, kind = cols[name]
        if kind == "copy" and name != "tcopy":
            continue
        r = {}
        try:
            if isinstance(make, list):  # FlashInfer's forms, the first that runs
                errs = []
                for note, m in make:
                    try:
                        o, s = run_once(m, x, pool, rs, ws, B)
                        if note:
                            r["note"] = note
                        break
                    except Exception as e:  # noqa: BLE001
                        errs.append(bd.err_text(e, 200))
                else:
                    raise RuntimeError(" | ".join(errs))
            else:
                o, s = run_once(make, x, pool, rs, ws, B)
        except Exception as e:  # noqa: BLE001 - reported, the probe goes on
            res[name] = {"error": bd.err_text(e)}
            continue
        refs[name] = (o, s)
        if name == "lib":  # every element written (a NaN left would compare equal everywhere)
            r["all_written"] = bool(torch.isfinite(o.float()).all() and
                                    torch.isfinite(s.float()).all())
        if ref == "copy=":
            rl = rs.long()[ws >= 0]
            src = pool.index_select(0, rl.clamp(min=0))
            src[rl < 0] = 0
            r["bits_vs_read_states"] = same_bits(s, src)
        elif ref == "lib?":  # another config of the library: equality reported, not required
            lo, ls = refs["lib"]
            r["bits_equal_lib_default"] = same_bits(o, lo) and same_bits(s, ls)
            r["max_abs_out_vs_lib"] = (o.float() - lo.float()).abs().max().item()
            r["max_abs_state_vs_lib"] = (s.float() - ls.float()).abs().max().item()
        elif ref == "lib~":
            lo, ls = refs["lib"]
            r["rel_diff_out"] = bd.rel(o, lo)
            r["rel_diff_state"] = bd.rel(s, ls)
        elif ref is not None and ref in refs:
            ro, rst = refs[ref]
            r["ref"] = ref
            r["bits_equal"] = same_bits(o, ro) and same_bits(s, rst)
            if ref != "lib":
                lo, ls = refs["lib"]
                r["bits_equal_lib_default"] = same_bits(o, lo) and same_bits(s, ls)
            if not r["bits_equal"]:
                r["max_abs_out"] = (o.float() - ro.float()).abs().nan_to_num(1e30).max().item()
                r["max_abs_state"] = (s.float() - rst.float()).abs().nan_to_num(1e30).max().item()
        res[name] = r
        if name not in ("lib", "lib_8x4x2"):  # only the references stay (B states each)
            del refs[name]
        del o, s
    return res


def special_check(dtype, B, only, pdl_ok, fi=None):
    """Rows that take the other branches: read -1 (zero state), padded (-1, -1), write -1."""
    x = bd.Inputs(torch, B, 1000 + B)
    dev = bd.DEVICE
    pool = torch.empty(2 * B + 1, bd.HV, V, K, dtype=dtype, device=dev).normal_(std=0.05)
    rs = torch.arange(1, B + 1, dtype=torch.int32, device=dev)
    ws = torch.arange(B + 1, 2 * B + 1, dtype=torch.int32, device=dev)
    rs[1] = -1
    if B > 2:
        rs[2] = ws[2] = -1
    if B > 3:
        ws[3] = -1
    cols = columns_for(B, dtype, None, [c for c in only if c not in ("fi", "copy")], pdl_ok)
    return check_columns(cols, x, pool, rs, ws, B)


def summarize_bits(res):
    bad = []
    for name, r in res.items():
        if "error" in r:
            bad.append(f"{name}: {r['error'][:200]}")
        elif r.get("all_written") is False:
            bad.append(f"{name}: NaN left in its output or written states (not all written)")
        elif r.get("bits_equal") is False:
            bad.append(f"{name}: differs from {r['ref']} (max abs out {r.get('max_abs_out')}, "
                       f"state {r.get('max_abs_state')})")
        elif r.get("bits_vs_read_states") is False:
            bad.append(f"{name}: written states != read states")
    return bad


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------

def sync():
    if bd.DEVICE == "cuda":
        torch.cuda.synchronize()


def plan(B, sb, slots, target, budget):
    """Launches M per replay (bench_decode's rule: >= 8 and >= target bytes) and the pools of
    ``slots`` slots that hold them, sets of B read + B write slots, slot 0 unused."""
    per_set = 2 * B * sb
    sets_per_pool = (slots - 1) // (2 * B)
    M = max(bd.MIN_LAUNCHES, -(-target // per_set))
    M = max(1, min(M, budget // (sets_per_pool * per_set) * sets_per_pool))
    P = -(-M // sets_per_pool)
    return M, P, sets_per_pool


def time_case(bench, tp, dtype, B, slots, fi, only, copy_tbps, pdl_ok, target, budget):
    sb = bd.state_bytes_of(torch, dtype)
    M, P, R = plan(B, sb, slots, target, budget)
    case = {"tp": tp, "HK": bd.HK, "HV": bd.HV, "pool": "fp32" if dtype == torch.float32 else "bf16",
            "B": B, "launches_per_replay": M, "pools": P, "slots_per_pool": slots,
            "lib_config": list(lib_cfg(B, dtype)), "state_bytes": 2 * B * sb,
            "decode_bytes": 2 * B * sb + bd.input_bytes(B)}
    x = bd.Inputs(torch, B, B)
    pools = [torch.empty(slots, bd.HV, V, K, dtype=dtype, device=bd.DEVICE).normal_(std=0.05)
             for _ in range(P)]
    sets = [(torch.arange(1 + 2 * B * r, 1 + 2 * B * r + B, dtype=torch.int32, device=bd.DEVICE),
             torch.arange(1 + 2 * B * r + B, 1 + 2 * B * (r + 1), dtype=torch.int32, device=bd.DEVICE))
            for r in range(R)]
    outs = [torch.empty(B, 1, bd.HV, V, dtype=torch.bfloat16, device=bd.DEVICE)
            for _ in range(min(bd.LAYERS, M))]
    cols = columns_for(B, dtype, fi, only, pdl_ok)
    # bit check on pool 0, set 0 (its write slots are overwritten by the timed launches anyway)
    case["check"] = check_columns(cols, x, pools[0], *sets[0], B)
    graphs, rows = {}, {}
    for name, (make, _, kind) in cols.items():
        row = rows[name] = {"kind": kind}
        if "error" in case["check"].get(name, {}):
            row["error"] = case["check"][name]["error"]
            continue
        if isinstance(make, list):
            note = case["check"].get(name, {}).get("note", "")
            make = dict(make)[note]
        fns = [make(x, pools[(j // R) % P], *sets[j % R], outs[j % len(outs)]) for j in range(M)]
        try:
            sync()
            t0 = time.perf_counter()
            fns[0]()
            sync()
            row["first_call_s"] = time.perf_counter() - t0
            graphs[name] = bench.graph(fns)
        except Exception as e:  # noqa: BLE001
            row["error"] = bd.err_text(e)
    names = list(graphs)
    for r in range(ARGS.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            rows[name].setdefault("ms_rounds", []).append(bench.ms(graphs[name].replay) / M)
    for name, row in rows.items():
        if "ms_rounds" not in row:
            continue
        row["ms"] = statistics.median(row["ms_rounds"])
        nbytes = case["decode_bytes"] if row["kind"] == "decode" else case["state_bytes"]
        row["TBps"] = nbytes / row["ms"] / 1e9
        row["pct_copy"] = 100 * row["TBps"] / copy_tbps
        row["pct_rounds"] = [100 * nbytes / t / 1e9 / copy_tbps for t in row["ms_rounds"]]
    case["columns"] = rows
    del graphs, pools, sets, outs, x
    bd.release(torch)
    return case


def print_case(case):
    cols = case["columns"]
    lib = cols.get("lib", {}).get("pct_copy")
    cells = []
    for name in COLUMNS:
        r = cols.get(name)
        if r is None:
            continue
        if "pct_copy" in r:
            d = f"{r['pct_copy'] - lib:+.2f}" if lib is not None and name != "lib" else ""
            cells.append(f"{name} {r['pct_copy']:.2f}{f' ({d})' if d else ''}")
        else:
            cells.append(f"{name} failed")
    bad = summarize_bits(case["check"])
    print(f"tp{case['tp']} {case['pool']} B={case['B']:<5} M={case['launches_per_replay']:<3} "
          + " | ".join(cells) + ("  BITS: " + "; ".join(bad) if bad else "  bits ok"), flush=True)


def print_table(results):
    cases = results["cases"]
    present = [c for c in COLUMNS if any(c in k["columns"] for k in cases)]
    print(f"\n% of copy bandwidth ({results['copy_TBps']:.3f} TB/s, {results['device']}); "
          f"median of {ARGS.rounds} rounds; in brackets the round-to-round spread (max - min)")
    hdr = f"{'tp':>2} {'pool':>4} {'B':>5} | " + " ".join(f"{c:>11}" for c in present)
    print(hdr)
    print("-" * len(hdr))
    for k in cases:
        cells = []
        for c in present:
            r = k["columns"].get(c)
            if r is None:
                cells.append(f"{'-':>11}")
            elif "pct_copy" not in r:
                cells.append(f"{'failed':>11}")
            else:
                sp = max(r["pct_rounds"]) - min(r["pct_rounds"])
                cells.append(f"{r['pct_copy']:6.2f}[{sp:.1f}]".rjust(11))
        print(f"{k['tp']:>2} {k['pool']:>4} {k['B']:>5} | " + " ".join(cells))
    bad = [f"tp{k['tp']} {k['pool']} B={k['B']} {b}" for k in cases for b in summarize_bits(k["check"])]
    for s in results.get("special_checks", []):
        bad += [f"special tp{s['tp']} {s['pool']} B={s['B']} {b}" for b in summarize_bits(s["check"])]
    print("bit checks: " + ("all variants equal their reference bit for bit (out and written "
                            "states)" if not bad else "FAILURES:\n  " + "\n  ".join(bad)))
    eq = {}
    for k in cases:
        for n, r in k["check"].items():
            if "bits_equal_lib_default" in r:
                eq.setdefault((k["pool"], n), []).append(r["bits_equal_lib_default"])
    if eq:
        print("BV 8 / 4 warps / nsub 2 equal to the library default (reported, not required): "
              + ", ".join(f"{n} {p}: {all(v)}" for (p, n), v in sorted(eq.items())))
    fi = [(k["tp"], k["pool"], k["B"], k["check"]["fi"]) for k in cases if "fi" in k["check"]]
    if fi:
        print("FlashInfer vs lib, largest rel diff out / state: " + "; ".join(
            f"{p} {max(r.get('rel_diff_out', 0) for _, pp, _, r in fi if pp == p):.1e} / "
            f"{max(r.get('rel_diff_state', 0) for _, pp, _, r in fi if pp == p):.1e}"
            for p in sorted({f[1] for f in fi})))
    for (name, dt, hv), info in sorted(INFO.items()):
        if info.get("n_regs") is not None or info.get("ldst"):
            print(f"  {name:7} {dt.replace('torch.', ''):8} HV {hv:2}: regs {info.get('n_regs')} "
                  f"spills {info.get('n_spills')} {info.get('ldst')} {info.get('policies') or ''}")


# --------------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------------

def cpu_check():
    bd.DEVICE = "cpu"
    bd.set_tp(2)
    B = ARGS.cpu_b
    only = [c for c in ARGS.only.split(",") if c]
    ok = True
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        t0 = time.perf_counter()
        res = special_check(dtype, B, only, pdl_ok=False)
        bad = summarize_bits(res)
        ok &= not bad
        ran = sorted(res)
        print(f"cpu-check tp2 (HK {bd.HK}, HV {bd.HV}) {str(dtype).replace('torch.', '')} B={B} "
              f"(rows: read -1, padded, write -1 included), lib config {lib_cfg(B, dtype)}: "
              f"{len(ran)} columns {ran}: " + ("all bit-identical to their reference"
                                               if not bad else "; ".join(bad))
              + f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        out.append({k: v for k, v in res.items()})
    print("CPU CHECK " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


def ptx_mode():
    """Compile every Triton column for sm_90 on this machine (no GPU needed) at TP 1."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gdn_graphs.ops.decode import _gdn_decode_kernel
    import subprocess
    import tempfile

    HK, HV = bd.TP_HEADS[1]
    ints = ("stride_qt", "stride_kt", "stride_vt", "stride_at", "stride_bt", "stride_ot",
            "stride_slot", "stride_w_slot", "Tmax", "T", "num_slots")
    div16 = set(ints[:7])

    def src(fn, pool, consts):
        types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16",
                     A_log_ptr="*fp32", dt_bias_ptr="*fp32", ssm_ptr=f"*{pool}", o_ptr="*bf16",
                     read_slot_ptr="*i32", write_slot_ptr="*i32", scale="fp32",
                     **{n: "i32" for n in ints})
        sig = {n: ("constexpr" if n in consts else types[n]) for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if sig[n].startswith("*") or n in div16}
        return ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v
                                              for k, v in consts.items()}, attrs=attrs)

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                             "cuobjdump")
    for pool, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        cfg = lib_cfg(64, dtype)
        jobs = [("lib", _gdn_decode_kernel.fn, cfg, dict(cu_seqlens=None, error_flag=None,
                 IS_VARLEN=False, USE_PDL=False, HAS_FLAG=False)),
                ("lib_8x4x2", _gdn_decode_kernel.fn, FI_CTA, dict(cu_seqlens=None,
                 error_flag=None, IS_VARLEN=False, USE_PDL=False, HAS_FLAG=False))]
        jobs += [(n, KERNELS[n],
                  FI_CTA if n == "fi_cta" else cfg, {}) for n in VARIANTS]
        for name, fn, (BV, nw, ns), extra in jobs:
            consts = dict(HK=HK, HV=HV, K=K, V=V, BK=K, BV=BV, NSUB=ns, **extra)
            ck = triton.compile(src(fn, pool, consts), target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=nw))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ck.asm["cubin"])
                f.flush()
                ru = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                                    text=True).stdout
            regs = re.findall(r"REG:(\d+)", ru)
            info = ptx_ops(ck.asm["ptx"])
            state = {k: v for k, v in info["ldst"].items() if ".v4" in k}
            print(f"{pool} {name:9} BV {BV} warps {nw} nsub {ns}: regs {regs[0] if regs else '?'}"
                  f", 128-bit state ld/st {state} {info['policies'] or ''}")
    return 0


def gpu_main():
    global K, V
    if ARGS.cpu_dry_run:
        bd._dry_run_setup()  # bench_decode's: DEVICE cpu, heads (1, 2) / (1, 1), K = V = 32
        K = V = bd.K
    elif not torch.cuda.is_available():
        print("probe_decode_fp32: needs a CUDA GPU (or --cpu-check / --ptx)", file=sys.stderr)
        return 2
    out_dir = ARGS.out or Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    t_start = time.perf_counter()
    bench = (bd.DryBench if ARGS.cpu_dry_run else bd.Bench)(torch, triton, quick=True)
    bench.warmup, bench.rep = ARGS.warmup, ARGS.rep
    only = [c for c in ARGS.only.split(",") if c]
    tps = [int(t) for t in ARGS.tp.split(",")]
    pools = [p for p in ARGS.pools.split(",") if p]
    batches = [int(b) for b in ARGS.batches.split(",")]
    GiB = 1 << 30
    target, budget = int(ARGS.target_gib * GiB), int(ARGS.budget_gib * GiB)
    pdl_ok = pdl_supported(torch.device(bd.DEVICE))
    if ARGS.cpu_dry_run:
        batches, target, budget = [4, 8], 1 << 16, 1 << 22
    results = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "commit": bd.git_commit(),
               "device": torch.cuda.get_device_name() if bd.DEVICE == "cuda" else "cpu dry run",
               "torch": torch.__version__, "triton": triton.__version__, "argv": sys.argv[1:],
               "rounds": ARGS.rounds, "do_bench": [ARGS.warmup, ARGS.rep],
               "target_bytes": target, "budget_bytes": budget}
    cbytes = 2 * GiB if bd.DEVICE == "cuda" else 1 << 20
    cps = [bd.copy_bandwidth(bench, cbytes)["TBps"] for _ in range(3)]
    results["copy_TBps_start"] = cps
    copy_tbps = results["copy_TBps"] = statistics.median(cps)
    print(f"copy bandwidth {copy_tbps:.3f} TB/s ({', '.join(f'{c:.3f}' for c in cps)}), "
          f"{results['device']}", flush=True)
    fi = None
    if "fi" in only and not ARGS.cpu_dry_run:
        fi, err = bd.load_fi_decode()
        results["fi_error"] = err
        if fi is None:
            print(f"NOTE: FlashInfer skipped, not importable: {err}", flush=True)
        else:
            results["fi_version"] = fi["version"]
            print(f"FlashInfer {fi['version']}", flush=True)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    results["cases"], results["special_checks"] = [], []
    path = out_dir / "probe_decode_fp32.json"
    for tp in tps:
        bd.set_tp(tp)
        for pname in pools:
            dtype = dtypes[pname]
            sb = 4 if ARGS.cpu_dry_run else 16
            s = special_check(dtype, sb, only, pdl_ok)
            results["special_checks"].append({"tp": tp, "pool": pname, "B": sb, "check": s})
            slots = 2 * max(batches) + 1
            for B in batches:
                case = time_case(bench, tp, dtype, B, slots, fi, only, copy_tbps, pdl_ok, target,
                                 budget)
                results["cases"].append(case)
                print_case(case)
                path.write_text(json.dumps(results, indent=1, default=str))
    results["copy_TBps_end"] = bd.copy_bandwidth(bench, cbytes)["TBps"]
    results["info"] = {f"{n} {d} HV{h}": v for (n, d, h), v in INFO.items()}
    results["wall_s"] = time.perf_counter() - t_start
    print_table(results)
    print(f"copy bandwidth at the end {results['copy_TBps_end']:.3f} TB/s; "
          f"wall {results['wall_s']:.0f} s")
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {path}")
    bad = [b for k in results["cases"] for b in summarize_bits(k["check"])]
    bad += [b for s in results["special_checks"] for b in summarize_bits(s["check"])]
    return 1 if bad else 0


def main():
    if ARGS.cpu_check:
        return cpu_check()
    if ARGS.ptx:
        return ptx_mode()
    return gpu_main()


if __name__ == "__main__":
    sys.exit(main())
