"""Benchmark the fused GDN decode kernel on the device (Qwen3-Next shapes), side by side with
FlashInfer, vLLM's Triton decode and fla-core.

    python3 profiling/bench_decode.py --out DIR [--quick] [--tp 1,2] [--pools fp32,bf16]
                                      [--only ours,fla,vllm,fi,copy] [--no-sweep]

Shapes: K = V = 128, bf16 inputs; heads HK 16 / HV 32 (TP 1: 2 MiB per fp32 state per layer) and
HK 8 / HV 16 (TP 2, --tp); read slots != write slots. For each batch size B (TP 1: 1, 4, 16, 64,
256, 1024; TP 2: 64, 256, 1024) it reports
  * per-layer kernel time: median (triton.testing.do_bench) of a CUDA graph that replays M
    launches over distinct pools/slot sets (>= ~1 GiB of state touched per replay, so nothing
    sits in the 60 MB L2), divided by M; bytes = B*HV*K*V*itemsize*2 + inputs and outputs;
    bandwidth and its ratio to the device copy bandwidth measured in the same run;
  * columns, for fp32 and bf16 pools (--pools): ours (gdn_decode), FlashInfer's
    gated_delta_rule_decode_pretranspose with the pool as initial_state and
    initial_state_indices / output_state_indices (its fp32 "legacy" kernel and its bf16-state
    kernels), vLLM 0.26's fused_recurrent_gated_delta_rule_packed_decode (the packed qkv tensor,
    one slot index per row: it reads and writes the same slot, so the same bytes), each with the
    relative difference of its output and written states to ours; the first call (compiles:
    FlashInfer's CuTe-DSL kernels, 1 per pool size for fp32) is timed apart and kept out of the
    medians. A row that fails (e.g. FlashInfer at B = 1) prints its error in the table;
  * a plain copy of the same B states from the read to the write slots (column "copy"), timed
    the same way: what moving those bytes costs at this B, launch and tail included, and ours
    as a fraction of it ("ours/it");
  * FLA's fused_recurrent_gated_delta_rule (fla-core) if importable, on a gathered state tensor
    (it has no slots), TP 1 fp32;
  * a stack of 36 decode layers, one pool per layer (fewer pools, shared round-robin by the
    layers, where 36 do not fit the memory budget: the JSON says how many), eager vs replayed
    from one CUDA graph, and the speedup (TP 1, fp32);
  * at B = 64 and 256 (and 1, 16 for the small-batch rule), a sweep of (BV, num_warps) with
    the best config (fp32); with bf16 pools at B = 64, 256, 1024 a wider sweep (see
    profiling/notes_decode_bf16.md).
Prints a table, writes DIR/bench_decode.json and DIR/bench_decode.png (if matplotlib imports).
Estimated (not yet run): 3-5 minutes on an H200 with every column, FlashInfer's compiles and
both sweeps included; --no-sweep saves about a minute, --quick about half.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TP_HEADS = {1: (16, 32), 2: (8, 16)}  # (HK, HV) per tensor-parallel degree of Qwen3-Next
HK, HV, K, V = 16, 32, 128, 128       # the heads of the TP degree being run (set_tp)
LAYERS = 36
BATCHES = (1, 4, 16, 64, 256, 1024)
BATCHES_TP2 = (64, 256, 1024)
SWEEP_B = (1, 16, 64, 256)  # 64 and 256 set the default; 1 and 16 inform the small-N rule
SWEEP = [(4, 1), (4, 2), (8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4),
         (32, 8), (64, 4), (64, 8)]
SWEEP_QUICK = [(4, 1), (8, 1), (8, 2), (16, 2), (16, 4), (32, 4), (64, 8)]
# bf16 pools (TP 1): see profiling/notes_decode_bf16.md. The default is BV 16 / 2 warps for
# B >= 16; these try smaller tiles with one warp (more programs, fewer elements per thread),
# larger tiles with more warps (fewer programs, more loads in flight each), whole-head tiles
# (BV 128, FlashInfer's tile) and 8 / 64 elements per thread.
BF16_SWEEP_B = (64, 256, 1024)
BF16_SWEEP = [(8, 1), (16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4), (32, 8), (64, 2),
              (64, 4), (64, 8), (128, 4), (128, 8), (128, 16)]
BF16_SWEEP_QUICK = [(8, 1), (16, 1), (16, 2), (32, 2), (32, 4), (64, 4), (128, 8)]
# (BV, num_warps, maxnreg): the default tile and its neighbours with registers per thread capped,
# to test whether registers (programs resident per SM) are what limits bf16 pools
BF16_SWEEP_MAXNREG = [(16, 2, 64), (16, 2, 96), (16, 1, 96), (32, 2, 96), (32, 2, 128),
                      (32, 4, 64)]
# (BV, num_warps, nsub): nsub [BV, K] tiles per program, each one's successor loaded during its
# math (gdn_decode's nsub), for bf16 and fp32 pools (NSUB_SWEEP_B)
NSUB_SWEEP = [(8, 1, 2), (8, 1, 4), (16, 2, 2), (16, 2, 4), (16, 1, 4), (32, 2, 2), (4, 1, 4)]
NSUB_SWEEP_B = (64, 256, 1024)
COLUMNS = ("ours", "fla", "vllm", "fi", "copy")
POOL_DTYPES = ("fp32", "bf16")
GiB = 1 << 30
MIN_LAUNCHES = 8  # per timed replay
DEVICE = "cuda"  # a CPU dry run of the bookkeeping may override it
STATE_BYTES = HV * K * V * 4  # one fp32 state at the current heads (set_tp)


def _int_list(text):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _choice_list(choices, flag):
    def parse(text):
        vals = [c.strip() for c in text.split(",") if c.strip()]
        if not vals or any(c not in choices for c in vals):
            raise argparse.ArgumentTypeError(f"{flag} takes some of {','.join(map(str, choices))}, "
                                             f"got {text!r}")
        return vals
    return parse


def _tp_list(text):
    tps = _int_list(text)
    if any(t not in TP_HEADS for t in tps):
        raise argparse.ArgumentTypeError(f"--tp takes some of {sorted(TP_HEADS)}, got {text!r}")
    return tps


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, type=Path, help="directory for JSON and PNG")
    p.add_argument("--quick", action="store_true",
                   help="half the memory, touched bytes and timing repetitions; a smaller sweep")
    p.add_argument("--tp", type=_tp_list, default=[1, 2], metavar="1,2",
                   help="tensor-parallel head counts: 1 = HK 16 / HV 32, 2 = HK 8 / HV 16 (default both)")
    p.add_argument("--pools", type=_choice_list(POOL_DTYPES, "--pools"), default=list(POOL_DTYPES),
                   metavar="fp32,bf16", help="pool dtypes of the columns (default both)")
    p.add_argument("--only", type=_choice_list(COLUMNS, "--only"), default=list(COLUMNS),
                   metavar=",".join(COLUMNS),
                   help="columns (default all; ours also runs, untimed, as the reference of the "
                        "differences)")
    p.add_argument("--batches", type=_int_list, default=None, metavar="1,4,16",
                   help=f"batch sizes at TP 1 (default {','.join(map(str, BATCHES))})")
    p.add_argument("--batches-tp2", type=_int_list, default=None, metavar="64,256",
                   help=f"batch sizes at TP 2 (default {','.join(map(str, BATCHES_TP2))})")
    p.add_argument("--no-fla", action="store_true", help="skip the fla-core comparison")
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM's Triton decode")
    p.add_argument("--no-fi", action="store_true", help="skip FlashInfer")
    p.add_argument("--no-sweep", action="store_true", help="skip the (BV, num_warps) sweeps")
    p.add_argument("--no-stack", action="store_true",
                   help="skip ours' detail at TP 1 fp32 (PDL, 36-layer stack, latency floor)")
    p.add_argument("--replot", type=Path, metavar="JSON",
                   help="only redraw DIR/bench_decode.png from a recorded bench_decode.json")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="check the bookkeeping on the CPU (Triton interpreter, tiny shapes, "
                        "wall-clock timer, no graphs, no fla/vLLM/FlashInfer); numbers mean nothing")
    args = p.parse_args(argv)
    for name in ("fla", "vllm", "fi"):
        if getattr(args, f"no_{name}") and name in args.only:
            args.only.remove(name)
    return args


def set_tp(tp):
    """Switch the module's head counts (and STATE_BYTES) to tensor-parallel degree ``tp``."""
    global HK, HV, STATE_BYTES
    HK, HV = TP_HEADS[tp]
    STATE_BYTES = HV * K * V * 4


def state_bytes_of(torch, dtype):
    return HV * K * V * torch.empty((), dtype=dtype).element_size()


def err_text(e, n=300):
    return f"{e.__class__.__name__}: {str(e)[:n]}"


def rel(x, y):
    x, y = x.float(), y.float()
    return ((x - y).norm() / y.norm()).item()


# ---------------------------------------------------------------------------------------------
# small utilities
# ---------------------------------------------------------------------------------------------

def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (sha or "no-commit") + ("+dirty" if dirty else "")
    except Exception as e:  # noqa: BLE001 - git missing is not fatal
        return f"unknown ({e.__class__.__name__})"


def progress(it, **kw):
    try:
        from tqdm import tqdm
        return tqdm(it, **kw)
    except ImportError:
        return it


class Bench:
    def __init__(self, torch, triton, quick):
        self.torch, self.triton, self.quick = torch, triton, quick
        self.rep = 50 if quick else 100
        self.warmup = 10 if quick else 25

    def ms(self, fn):
        """Median milliseconds of fn (do_bench flushes L2 before every call)."""
        return float(self.triton.testing.do_bench(fn, warmup=self.warmup, rep=self.rep,
                                                  return_mode="median"))

    def graph(self, fns):
        """Capture fns (already warmed up) into one CUDA graph, after a warm-up on a side stream."""
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        torch.cuda.synchronize()
        return g

    def per_call_ms(self, fns):
        """Median time per call of fns when replayed back to back from one graph."""
        g = self.graph(fns)
        t = self.ms(g.replay) / len(fns)
        del g
        return t


class DryBench(Bench):
    """--cpu-dry-run: one wall-clock call instead of do_bench, plain calls instead of graphs."""

    def ms(self, fn):
        import time
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def graph(self, fns):
        class Replay:
            @staticmethod
            def replay():
                for f in fns:
                    f()
        return Replay


def release(torch):
    """Wait for the device and give cached blocks back before the next, differently sized step."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def input_bytes(B):
    # q, k [B, HK, K] + v, out [B, HV, V] in bf16, a, b [B, HV] bf16, two int32 slots
    return B * (2 * HK * K * 2 + 2 * HV * V * 2 + 2 * HV * 2 + 8)


# ---------------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------------

def copy_bandwidth(bench, nbytes):
    torch = bench.torch
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    t = bench.ms(lambda: dst.copy_(src))
    del src, dst
    release(torch)
    return {"bytes": 2 * nbytes, "ms": t, "TBps": 2 * nbytes / t / 1e9}


def make_inputs(torch, B, gen_seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(gen_seed)
    packed = torch.randn(B, 2 * HK * K + HV * V, device=DEVICE, generator=g).bfloat16()
    q = packed[:, :HK * K].unflatten(1, (HK, K))
    k = packed[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
    v = packed[:, 2 * HK * K:].unflatten(1, (HV, V))
    a = torch.randn(B, HV, device=DEVICE, generator=g).bfloat16()
    b = torch.randn(B, HV, device=DEVICE, generator=g).bfloat16()
    A_log = torch.rand(HV, device=DEVICE, generator=g)
    dt_bias = torch.randn(HV, device=DEVICE, generator=g)
    return q, k, v, a, b, A_log, dt_bias


def plan_pools(B, budget, target, state_bytes=None):
    """P pools (layers) of R slot sets each; a set is B read slots + B write slots."""
    per_set = 2 * B * (state_bytes or STATE_BYTES)
    P = max(1, min(LAYERS, budget // per_set))
    need = max(1, math.ceil(target / per_set))
    R = max(1, min(math.ceil(need / P), max(1, budget // (per_set * P))))
    M = min(P * R, max(MIN_LAUNCHES, need))
    return P, R, M


def bench_ours(bench, gdn_decode, B, budget, target, sweep, detail=True):
    """Ours at TP 1 with fp32 pools, in detail: the per-call time, eager single call, with PDL,
    the 36-layer stack eager vs graph (detail), the (BV, num_warps) sweep."""
    torch = bench.torch
    P, R, M = plan_pools(B, budget, target)
    q, k, v, a, b, A_log, dt_bias = make_inputs(torch, B, B)
    pools = [torch.empty(2 * B * R, HV, V, K, device=DEVICE).normal_(std=0.05) for _ in range(P)]
    sets = []  # (read, write) int32 slot tensors per set
    for r in range(R):
        base = 2 * B * r
        sets.append((torch.arange(base, base + B, dtype=torch.int32, device=DEVICE),
                     torch.arange(base + B, base + 2 * B, dtype=torch.int32, device=DEVICE)))
    outs = [torch.empty(B, HV, V, dtype=torch.bfloat16, device=DEVICE) for _ in range(LAYERS)]

    def call(j, **kw):
        pool, (rs, ws) = pools[j % P], sets[(j // P) % R]
        out = outs[j % LAYERS]
        return lambda: gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, rs, ws, out=out, **kw)

    state_bytes = 2 * B * STATE_BYTES
    total_bytes = state_bytes + input_bytes(B)
    res = {"B": B, "pools": P, "sets_per_pool": R, "launches_per_replay": M,
           "touched_GiB_per_replay": M * state_bytes / GiB,
           "state_bytes": state_bytes, "total_bytes": total_bytes}
    fns = [call(j) for j in range(M)]
    fns[0]()  # compile outside any capture
    t = bench.per_call_ms(fns)
    res.update(ms=t, TBps=total_bytes / t / 1e9)
    res["eager_single_call_ms"] = bench.ms(fns[0])

    if detail:
        _bench_ours_detail(bench, call, fns, M, total_bytes, res)

    sweep_rows = []
    if sweep:
        for BV, nw in progress(sweep, desc=f"sweep B={B}", leave=False):
            try:
                fs = [call(j, BV=BV, num_warps=nw) for j in range(M)]
                fs[0]()
                ts = bench.per_call_ms(fs)
                sweep_rows.append({"BV": BV, "num_warps": nw, "ms": ts,
                                   "TBps": total_bytes / ts / 1e9})
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported
                sweep_rows.append({"BV": BV, "num_warps": nw, "error": repr(e)[:200]})
    res["sweep"] = sweep_rows

    # keep one output for the FLA cross-check
    rs0, _ = sets[0]
    check = {"gathered": pools[0][rs0.long()].clone(), "inputs": (q, k, v, a, b, A_log, dt_bias)}
    o_ref = torch.empty(B, HV, V, dtype=torch.bfloat16, device=DEVICE)
    scratch = pools[0].clone() if pools[0].numel() * 4 <= GiB else None
    if scratch is not None:
        gdn_decode(q, k, v, a, b, A_log, dt_bias, scratch, *sets[0], out=o_ref)
        check["out"] = o_ref
    del pools, scratch, fns
    release(torch)
    return res, check


def _bench_ours_detail(bench, call, fns, M, total_bytes, res):
    # the same launches with programmatic dependent launch (each kernel's slot and state loads
    # overlap the previous kernel)
    pdl = DEVICE == "cuda"
    fns_pdl = [call(j, pdl=pdl) for j in range(M)]
    fns_pdl[0]()
    t = bench.per_call_ms(fns_pdl)
    res.update(ms_pdl=t, TBps_pdl=total_bytes / t / 1e9)

    # the layer stack: layer l uses pool l % P (one pool per layer when P == 36)
    stack = [call(l) for l in range(LAYERS)]
    res["stack_eager_ms"] = bench.ms(lambda: [f() for f in stack])
    g = bench.graph(stack)
    res["stack_graph_ms"] = bench.ms(g.replay)
    res["stack_speedup"] = res["stack_eager_ms"] / res["stack_graph_ms"]
    g = bench.graph(fns_pdl[:LAYERS] if M >= LAYERS else [call(l, pdl=pdl) for l in range(LAYERS)])
    res["stack_graph_pdl_ms"] = bench.ms(g.replay)
    res["stack_speedup_pdl"] = res["stack_eager_ms"] / res["stack_graph_pdl_ms"]
    del g, fns_pdl


def latency_floor(bench, B):
    """What a stack of 36 launches costs when the kernels do (almost) nothing, at decode's grid and
    tile for B rows: an empty kernel, and a kernel that only copies each program's [BV, K] state
    tile from its read slot to its write slot (the two dependent loads every decode program makes:
    slot, then state). Same graph replay and timing as the stack."""
    torch, triton = bench.torch, bench.triton
    import triton.language as tl
    from gdn_graphs.ops.decode import default_config

    @triton.jit
    def empty_kernel(x_ptr):
        pass

    @triton.jit
    def slot_copy_kernel(pool, rs_ptr, ws_ptr, stride_s, K: tl.constexpr, V: tl.constexpr,
                         BV: tl.constexpr):
        i_n, i_j = tl.program_id(0), tl.program_id(1)
        NV: tl.constexpr = V // BV
        o = (i_j // NV) * V * K + ((i_j % NV) * BV + tl.arange(0, BV))[:, None] * K \
            + tl.arange(0, K)[None, :]
        rs = tl.load(rs_ptr + i_n).to(tl.int64)
        ws = tl.load(ws_ptr + i_n).to(tl.int64)
        tl.store(pool + ws * stride_s + o, tl.load(pool + rs * stride_s + o))

    BV, nw = default_config(K, V, B, torch.float32)[:2]
    grid = (B, HV * (V // BV))
    pools = [torch.zeros(2 * B, HV, V, K, device=DEVICE) for _ in range(LAYERS)]
    rs = torch.arange(B, dtype=torch.int32, device=DEVICE)
    ws = rs + B
    x = torch.zeros(1, device=DEVICE)
    empty = [lambda: empty_kernel[grid](x, num_warps=nw) for _ in range(LAYERS)]
    copy = [lambda p=p: slot_copy_kernel[grid](p, rs, ws, p.stride(0), K=K, V=V, BV=BV,
                                               num_warps=nw) for p in pools]
    empty[0](), copy[0]()
    out = {}
    for name, fns in (("empty", empty), ("slot_copy", copy)):
        g = bench.graph(fns)
        out[f"stack_graph_{name}_ms"] = bench.ms(g.replay)
        del g
    del pools
    release(torch)
    return out


def load_fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as f
    except Exception as e:  # noqa: BLE001
        return None, f"not importable: {e!r}"[:300]
    return f, None


def bench_fla(bench, fla_fn, B, budget, target, check):
    """FLA's fused recurrent kernel on gathered states [B, HV, V, K] (or [B, HV, K, V])."""
    torch = bench.torch
    q, k, v, a, b, A_log, dt_bias = check["inputs"]
    params = inspect.signature(fla_fn).parameters
    v_first = "state_v_first" in params
    gate_in_kernel = "use_gate_in_kernel" in params and "use_beta_sigmoid_in_kernel" in params
    notes = []
    kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    if v_first:
        kw["state_v_first"] = True
    else:
        notes.append("no state_v_first: state passed as [B, HV, K, V]")
    if gate_in_kernel:
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True)
        g_in, beta_in = a[None], b[None]
    else:
        notes.append("gating (g, beta) precomputed outside the timed region")
        gf = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
        g_in, beta_in = gf[None], torch.sigmoid(b.float())[None].to(b.dtype)
    # [1, B, H, D]: the varlen-free form with T = B tokens would be one sequence, so use [B, 1, ...]
    qf = q.unsqueeze(1).contiguous()
    kf = k.unsqueeze(1).contiguous()
    vf = v.unsqueeze(1).contiguous()
    g_in = g_in.transpose(0, 1).contiguous()     # [B, 1, HV]
    beta_in = beta_in.transpose(0, 1).contiguous()
    state_bytes = 2 * B * STATE_BYTES
    # distinct initial states (and, kept alive, distinct final states) per call: >= target bytes
    fit = max(2, (budget // 2) // (B * STATE_BYTES))
    n_sets = min(512, max(2, min(math.ceil(target / state_bytes) + 1, fit)))
    first = check["gathered"] if v_first else check["gathered"].transpose(-1, -2).contiguous()
    states = [first] + [first.clone() for _ in range(n_sets - 1)]
    keep = []

    def call(j):
        def f():
            o, ht = fla_fn(qf, kf, vf, g=g_in, beta=beta_in, initial_state=states[j], **kw)
            keep.append((o, ht))  # distinct output memory per call inside the graph
        return f

    res = {"B": B, "notes": notes, "sets": n_sets, "state_bytes": state_bytes,
           "total_bytes": state_bytes + input_bytes(B)}
    fns = [call(j) for j in range(n_sets)]
    fns[0]()
    if "out" in check:
        o = keep[-1][0].reshape(B, HV, V).float()
        ref = check["out"].float()
        res["rel_diff_vs_ours"] = ((o - ref).norm() / ref.norm()).item()
    keep.clear()
    t = bench.per_call_ms(fns)
    keep.clear()
    res.update(ms=t, TBps=res["total_bytes"] / t / 1e9)
    del states
    release(torch)
    return res


# ---------------------------------------------------------------------------------------------
# columns: ours, FlashInfer and vLLM on the same pools, slot sets and bytes
# ---------------------------------------------------------------------------------------------

class Inputs:
    """One batch's inputs in every form the columns take: q, k [B, HK, K] and v [B, HV, V] as
    views of one packed projection (ours, vLLM's packed decode: ``packed``), the same as
    [B, 1, H, D] views (FlashInfer), a, b [B, HV] and [B, 1, HV]."""

    def __init__(self, torch, B, seed):
        self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias = make_inputs(torch, B, seed)
        self.packed = self.q.as_strided((B, 2 * HK * K + HV * V), (self.q.stride(0), 1))
        self.q4, self.k4, self.v4 = (t.unsqueeze(1) for t in (self.q, self.k, self.v))
        self.a3, self.b3 = self.a.unsqueeze(1), self.b.unsqueeze(1)

    def contiguous4(self):
        """q, k, v [B, 1, H, D] as compact copies (the fallback when a kernel refuses the views)."""
        return tuple(t.contiguous() for t in (self.q4, self.k4, self.v4))


def make_ours(gdn_decode, **kw):
    def make(x, pool, rs, ws, out):
        o = out[:, 0]
        return lambda: gdn_decode(x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, rs, ws, out=o, **kw)
    return make


def make_fi(fi_decode, contiguous=False):
    """FlashInfer's pool decode: state None, the pool as initial_state, read and write indices."""
    def make(x, pool, rs, ws, out):
        q, k, v = x.contiguous4() if contiguous else (x.q4, x.k4, x.v4)
        return lambda: fi_decode(q=q, k=k, v=v, state=None, A_log=x.A_log, a=x.a3, dt_bias=x.dt_bias,
                                 b=x.b3, scale=K ** -0.5, output=out, use_qk_l2norm=True,
                                 initial_state=pool, initial_state_indices=rs,
                                 output_state_indices=ws)
    return make


def make_fi_padded(fi_decode):
    """FlashInfer on the batch plus one padding row (a copy of row 0 reading and writing slot 0,
    which no other row uses): the last resort when it refuses a batch of one (seen once at B = 1,
    a CuTe-DSL argument error, not investigated; perhaps the size-1 batch and token dims leave its
    layout marking ambiguous). The row's time then includes the padding row; bytes are counted for
    B rows."""
    import torch

    def make(x, pool, rs, ws, out_full):
        q, k, v = (torch.cat([t, t[:1]]) for t in (x.q4, x.k4, x.v4))
        a, b = (torch.cat([t, t[:1]]) for t in (x.a3, x.b3))
        zero = torch.zeros(1, dtype=rs.dtype, device=rs.device)
        rs2, ws2 = torch.cat([rs, zero]), torch.cat([ws, zero])
        return lambda: fi_decode(q=q, k=k, v=v, state=None, A_log=x.A_log, a=a, dt_bias=x.dt_bias,
                                 b=b, scale=K ** -0.5, output=out_full, use_qk_l2norm=True,
                                 initial_state=pool, initial_state_indices=rs2,
                                 output_state_indices=ws2)
    make.full_out = True
    return make


def make_copy():
    """The floor of any decode at this B: a plain copy of the B states from the read slots to the
    write slots (every column's sets are B consecutive slots each), the state bytes a decode
    moves and nothing else, launched and replayed like the columns."""
    def make(x, pool, rs, ws, out):
        r0, w0, n = int(rs[0]), int(ws[0]), rs.numel()  # (a sync, outside any timing)
        src, dst = pool[r0:r0 + n], pool[w0:w0 + n]
        return lambda: dst.copy_(src)
    return make


def make_vllm(vl_decode):
    """vLLM's packed decode: reads and writes ssm_state_indices (the read slots), in place."""
    def make(x, pool, rs, ws, out):
        return lambda: vl_decode(mixed_qkv=x.packed, a=x.a, b=x.b, A_log=x.A_log, dt_bias=x.dt_bias,
                                 scale=K ** -0.5, initial_state=pool, out=out, ssm_state_indices=rs,
                                 use_qk_l2norm_in_kernel=True)
    return make


def bench_column(bench, makers, B, dtype, budget, target, ref_make=None, in_place=False,
                 label=""):
    """Time one column at batch B on pools of ``dtype``: M launches over distinct pools and slot
    sets replayed from one graph, like ours. ``makers``: [(note, make)] tried in order until the
    first call works (make(inputs, pool, read, write, out) -> a callable). Slot 0 of every pool is
    never used (vLLM reads slot index 0 as "no state"). The first call, made on pool 0 / set 0
    before anything else touched them, is timed on its own (compiles) and compared with
    ``ref_make`` run on a copy of the same read states: out and the states written (at the read
    slots when ``in_place``)."""
    import time
    torch = bench.torch
    sb = state_bytes_of(torch, dtype)
    P, R, M = plan_pools(B, budget, target, sb)
    x = Inputs(torch, B, B)
    state_total = 2 * B * sb
    res = {"B": B, "dtype": str(dtype).replace("torch.", ""), "pools": P, "sets_per_pool": R,
           "launches_per_replay": M, "state_bytes": state_total,
           "total_bytes": state_total + input_bytes(B)}
    pools = sets = outs = fns = outs_full = None
    try:
        pools = [torch.empty(2 * B * R + 1, HV, V, K, device=DEVICE, dtype=dtype).normal_(std=0.05)
                 for _ in range(P)]
        sets = [(torch.arange(1 + 2 * B * r, 1 + 2 * B * r + B, dtype=torch.int32, device=DEVICE),
                 torch.arange(1 + 2 * B * r + B, 1 + 2 * B * (r + 1), dtype=torch.int32, device=DEVICE))
                for r in range(R)]
        # one spare row per output: a maker that pads the batch (padded_fi) writes it
        outs_full = [torch.empty(B + 1, 1, HV, V, dtype=torch.bfloat16, device=DEVICE)
                     for _ in range(min(LAYERS, M))]
        outs = [o[:B] for o in outs_full]
        rs0, ws0 = sets[0]
        saved = pools[0].index_select(0, rs0.long()) if ref_make is not None else None
        errors = []
        for note, make in makers:
            o_arg = outs_full if getattr(make, "full_out", False) else outs
            fns = [make(x, pools[j % P], *sets[(j // P) % R], o_arg[j % len(outs)]) for j in range(M)]
            try:
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fns[0]()
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                res["first_call_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - try the next form, report all
                errors.append(f"{note or 'as is'}: {err_text(e, 200)}")
                fns = None
                continue
            if note:
                res["note"] = note
            break
        if fns is None:
            res["error"] = " | ".join(errors)
            return res
        if errors:
            res["earlier_errors"] = errors
        if ref_make is not None:
            written = rs0 if in_place else ws0
            got_state = pools[0].index_select(0, written.long())
            chk = torch.zeros(2 * B + 1, HV, V, K, device=DEVICE, dtype=dtype)
            chk[rs0.long()] = saved
            o_ref = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=DEVICE)
            ref_make(x, chk, rs0, ws0, o_ref)()
            res["rel_diff_out"] = rel(outs[0], o_ref)
            res["rel_diff_state"] = rel(got_state, chk.index_select(0, ws0.long()))
            del chk, got_state, saved
        t = bench.per_call_ms(fns)
        res.update(ms=t, TBps=res["total_bytes"] / t / 1e9)
    except Exception as e:  # noqa: BLE001 - the row reports it, the bench goes on
        res["error"] = err_text(e)
    finally:
        del pools, sets, outs, fns, outs_full
        release(torch)
    if label:
        print(f"  {label} B={B}: " + (f"{res['ms'] * 1e3:.1f} us, {res['TBps']:.2f} TB/s"
                                     if "ms" in res else f"failed: {res['error'][:200]}"), flush=True)
    return res


def load_fi_decode():
    try:
        import flashinfer
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose as f
    except Exception as e:  # noqa: BLE001 - optional
        return None, err_text(e)
    return dict(fn=f, version=getattr(flashinfer, "__version__", "?")), None


VLLM_FLA_MODULES = ("vllm.third_party.flash_linear_attention.ops",  # vLLM 0.26
                    "vllm.model_executor.layers.fla.ops")            # older vLLM


def load_vllm_decode():
    import importlib
    errs = []
    for mod in VLLM_FLA_MODULES:
        try:
            fn = importlib.import_module(mod).fused_recurrent_gated_delta_rule_packed_decode
        except Exception as e:  # noqa: BLE001 - optional
            errs.append(f"{mod}: {err_text(e, 150)}")
            continue
        try:
            import vllm
            ver = getattr(vllm, "__version__", "?")
        except Exception:  # noqa: BLE001
            ver = "?"
        return dict(fn=fn, module=mod, version=ver), None
    return None, "; ".join(errs)


def run_columns(bench, torch, gdn_decode, args, fi, vl, budget, target, copy_tbps, ours_tp1_fp32):
    """Every (tp, pool dtype, B, column) row; ours' TP-1 fp32 row is bench_ours' (not re-timed)."""
    from gdn_graphs.ops.decode import pdl_supported
    rows = []
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    with_pdl = DEVICE == "cuda" and pdl_supported(torch.device(DEVICE))
    for tp in args.tp:
        set_tp(tp)
        batches = (args.batches or BATCHES) if tp == 1 else (args.batches_tp2 or BATCHES_TP2)
        for dname in args.pools:
            dtype = dtypes[dname]
            for B in batches:
                base = dict(tp=tp, HK=HK, HV=HV, pool=dname, B=B)
                ours = make_ours(gdn_decode)
                if "ours" in args.only:
                    if tp == 1 and dname == "fp32" and B in ours_tp1_fp32:
                        o = ours_tp1_fp32[B]
                        r = {k: o[k] for k in ("ms", "TBps", "total_bytes", "pools", "launches_per_replay")}
                        r["note"] = "bench_ours' row"
                    else:
                        r = bench_column(bench, [("", ours)], B, dtype, budget, target,
                                         label=f"ours tp{tp} {dname}")
                    r["config"] = list(default_config_of(gdn_decode, B, dtype))
                    rows.append(dict(base, column="ours", **r))
                    if with_pdl:
                        # as the runtime launches it on Hopper (runtime/core.py: pdl_supported):
                        # programmatic dependent launch, each launch's ramp-up overlapping the
                        # previous one's tail; the same bits
                        r = bench_column(bench, [("", make_ours(gdn_decode, pdl=True))], B, dtype,
                                         budget, target, ref_make=ours, label=f"ours+PDL tp{tp} {dname}")
                        rows.append(dict(base, column="ours_pdl", **r))
                if fi is not None:
                    makers = [("", make_fi(fi["fn"])),
                              ("q, k, v copied contiguous", make_fi(fi["fn"], True))]
                    if B == 1:
                        makers.append(("padded to 2 rows (time includes the padding row)",
                                       make_fi_padded(fi["fn"])))
                    r = bench_column(bench, makers, B, dtype, budget, target, ref_make=ours,
                                     label=f"FlashInfer tp{tp} {dname}")
                    rows.append(dict(base, column="fi", **r))
                if vl is not None:
                    r = bench_column(bench, [("", make_vllm(vl["fn"]))], B, dtype, budget, target,
                                     ref_make=ours, in_place=True, label=f"vLLM tp{tp} {dname}")
                    rows.append(dict(base, column="vllm", **r))
                if "copy" in args.only:
                    r = bench_column(bench, [("", make_copy())], B, dtype, budget, target,
                                     label=f"copy tp{tp} {dname}")
                    if "ms" in r:  # it moves the states only: its bandwidth counts those
                        r["total_bytes"] = r["state_bytes"]
                        r["TBps"] = r["state_bytes"] / r["ms"] / 1e9
                    rows.append(dict(base, column="copy", **r))
    set_tp(1)
    for r in rows:
        if "TBps" in r:
            r["ratio_to_copy"] = r["TBps"] / copy_tbps
    return rows


def default_config_of(gdn_decode, B, dtype):
    """ours' default (BV, num_warps) at the current heads (gdn_decode unused: same module)."""
    from gdn_graphs.ops.decode import default_config
    return default_config(K, V, B, dtype)


def make_ours_raw(BV, num_warps, maxnreg=None, info=None, nsub=1):
    """Ours' kernel launched directly (the arguments gdn_decode's _launch passes for one token per
    row, no PDL, no error flag) so that a sweep can also cap registers per thread (Triton's
    ``maxnreg``) and read the compiled kernel's registers and spills into ``info``."""
    import triton
    from gdn_graphs.ops.decode import _gdn_decode_kernel

    def make(x, pool, rs, ws, out):
        o = out[:, 0]
        N = x.q.shape[0]
        grid = (N * HV * triton.cdiv(V, BV * nsub),)  # the kernel's flat grid
        kw = dict(num_warps=num_warps, NSUB=nsub, **({"maxnreg": maxnreg} if maxnreg else {}))

        def call():
            ck = _gdn_decode_kernel[grid](
                x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, o, None, rs, ws, None,
                x.q.stride(0), x.k.stride(0), x.v.stride(0), x.a.stride(0), x.b.stride(0),
                o.stride(0), pool.stride(0), 1, 1, N, pool.shape[0], K ** -0.5,
                HK=HK, HV=HV, K=K, V=V, BV=BV, USE_PDL=False, **kw)
            if info is not None and "n_regs" not in info:
                for key in ("n_regs", "n_spills"):
                    info[key] = getattr(ck, key, None)
        return call
    return make


def _sweep_row(bench, torch, gdn_decode, B, dtype, cfg, budget, target, copy):
    """One sweep row: ours' kernel at ``cfg`` = (BV, num_warps, maxnreg, nsub), checked against
    the default config, with its registers and spills."""
    BV, nw, maxnreg, ns = cfg
    info = {}
    r = bench_column(bench, [("", make_ours_raw(BV, nw, maxnreg, info, ns))], B, dtype, budget,
                     target, ref_make=make_ours(gdn_decode))
    r.update(BV=BV, num_warps=nw, maxnreg=maxnreg, nsub=ns, **info)
    if "TBps" in r:
        r["ratio_to_copy"] = r["TBps"] / copy
    return r


def _sweep_batches(args, allowed):
    return [B for B in (args.batches or allowed) if B in allowed] or list(allowed)


def run_bf16_sweep(bench, torch, gdn_decode, args, budget, target, copy):
    """Ours with a bf16 pool at TP 1 over BF16_SWEEP's (BV, num_warps), BF16_SWEEP_MAXNREG's
    register caps and NSUB_SWEEP's tiles per program, B in BF16_SWEEP_B; each row checked
    against the default config and carrying the kernel's registers per thread and spills (see
    profiling/notes_decode_bf16.md)."""
    set_tp(1)
    rows = []
    configs = [(BV, nw, None, 1) for BV, nw in (BF16_SWEEP_QUICK if args.quick else BF16_SWEEP)]
    configs += [] if args.quick else [(BV, nw, cap, 1) for BV, nw, cap in BF16_SWEEP_MAXNREG]
    configs += [(BV, nw, None, ns) for BV, nw, ns in NSUB_SWEEP]
    for B in progress(_sweep_batches(args, BF16_SWEEP_B), desc="bf16 sweep"):
        rows += [_sweep_row(bench, torch, gdn_decode, B, torch.bfloat16, cfg, budget, target, copy)
                 for cfg in configs]
        # the default config with programmatic dependent launch: how much of the small-B gap is
        # the launch's ramp-up and tail (the previous kernel's tail overlaps this one's loads)
        if DEVICE == "cuda":
            r = bench_column(bench, [("", make_ours(gdn_decode, pdl=True))], B, torch.bfloat16,
                             budget, target, ref_make=make_ours(gdn_decode))
            cfg = default_config_of(gdn_decode, B, torch.bfloat16)
            r.update(BV=cfg[0], num_warps=cfg[1], nsub=cfg[2], maxnreg=None, pdl=True)
            if "TBps" in r:
                r["ratio_to_copy"] = r["TBps"] / copy
            rows.append(r)
    return rows


def run_nsub_sweep_fp32(bench, torch, gdn_decode, args, budget, target, copy):
    """Ours with an fp32 pool at TP 1 over NSUB_SWEEP (tiles per program), B in NSUB_SWEEP_B,
    each row checked against the default config (the bf16 sweep holds the bf16 rows)."""
    set_tp(1)
    return [_sweep_row(bench, torch, gdn_decode, B, torch.float32, (BV, nw, None, ns), budget,
                       target, copy)
            for B in progress(_sweep_batches(args, NSUB_SWEEP_B), desc="fp32 nsub sweep")
            for BV, nw, ns in NSUB_SWEEP]


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def column_rows(results, tp, pool, column):
    """{B: row} of results['columns'] for one (tp, pool dtype, column)."""
    return {r["B"]: r for r in results.get("columns", [])
            if r["tp"] == tp and r["pool"] == pool and r["column"] == column}


def plot(path, results, copy_tbps):
    """One bandwidth panel per TP degree run (every column, both pools), and the 36-layer stack
    where ours' detail ran."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tps = sorted({r["tp"] for r in results.get("columns", [])}) or [1]
    ours = results.get("ours", [])
    stack = bool(ours) and all("stack_eager_ms" in r for r in ours)
    fig, axes = plt.subplots(1, len(tps) + stack, figsize=(6.5 * (len(tps) + stack), 4.8), squeeze=False)
    styles = {"ours": "o", "ours_pdl": "^", "fi": "D", "vllm": "v"}
    names = {"ours": "gdn_graphs", "ours_pdl": "gdn_graphs + PDL", "fi": "FlashInfer pretranspose",
             "vllm": "vLLM packed decode"}
    for ax, tp in zip(axes[0], tps):
        if tp == 1:
            fla = [r for r in results.get("fla", []) if "TBps" in r]
            if fla:
                ax.plot([r["B"] for r in fla], [r["TBps"] for r in fla], "s--",
                        label="fla fused_recurrent (gathered), fp32")
        for pool, ls in (("fp32", "-"), ("bf16", ":")):
            for col in names:
                rows = sorted((B, r["TBps"]) for B, r in column_rows(results, tp, pool, col).items()
                              if "TBps" in r)
                if rows:
                    ax.plot(*zip(*rows), styles[col] + ls, label=f"{names[col]}, {pool}")
        ax.axhline(copy_tbps, color="k", lw=0.8, label=f"device copy {copy_tbps:.2f} TB/s")
        ax.axhline(0.95 * copy_tbps, color="k", lw=0.8, ls=":", label="95% of copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch B")
        ax.set_ylabel("TB/s (read + write)")
        ax.set_title(f"per-layer decode bandwidth, TP {tp}")
        ax.legend(fontsize=6)
    if stack:
        ax = axes[0][-1]
        Bs = [r["B"] for r in ours]
        ax.plot(Bs, [r["stack_eager_ms"] for r in ours], "o-", label="eager")
        ax.plot(Bs, [r["stack_graph_ms"] for r in ours], "o-", label="CUDA graph")
        if all("stack_graph_pdl_ms" in r for r in ours):
            ax.plot(Bs, [r["stack_graph_pdl_ms"] for r in ours], "^-", label="CUDA graph, PDL")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_ylabel(f"ms for {LAYERS} layers")
        ax.set_title(f"{LAYERS}-layer decode stack (fp32)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{results['device']}  {results['date']}  {results['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _cell(r, copy, diff=True):
    """'us %copy [diff]' of one column row, or its failure."""
    if r is None:
        return f"{'n/a':>8} {'':>6}" + (f" {'':>7}" if diff else "")
    if "ms" not in r:
        return f"{'failed':>8} {'':>6}" + (f" {'':>7}" if diff else "")
    d = f" {r['rel_diff_out']:7.1e}" if diff and isinstance(r.get("rel_diff_out"), float) else \
        (f" {'':>7}" if diff else "")
    return f"{r['ms'] * 1e3:8.1f} {100 * r['TBps'] / copy:5.1f}%" + d


def _sweep_cfg(r):
    regs = f" {r['n_regs']}r" if r.get("n_regs") else ""
    spill = f" {r['n_spills']}sp" if r.get("n_spills") else ""
    cap = f" cap{r['maxnreg']}" if r.get("maxnreg") else ""
    pdl = " pdl" if r.get("pdl") else ""
    nsub = f" x{r['nsub']}" if r.get("nsub", 1) > 1 else ""
    return f"BV {r['BV']}/{r['num_warps']}w{nsub}{cap}{pdl}{regs}{spill}"


def print_columns(results):
    copy = results["copy"]["TBps"]
    cols = results.get("columns", [])
    if not cols:
        return
    print("\ncolumns side by side: us per layer, % of copy bandwidth, rel diff of out to ours "
          "(states: the JSON)")
    hdr = (f"{'tp':>3} {'pool':>5} {'B':>5} | {'ours us':>8} {'%copy':>6} | {'+PDL us':>8} {'%copy':>6} "
           f"| {'FI us':>8} {'%copy':>6} "
           f"{'diff':>7} | {'vLLM us':>8} {'%copy':>6} {'diff':>7} | {'copy us':>8} {'%copy':>6} "
           f"{'ours/it':>7}")
    print(hdr)
    print("-" * len(hdr))
    keys = sorted({(r["tp"], r["pool"]) for r in cols}, key=lambda t: (t[0], t[1] != "fp32"))
    failures = []
    for tp, pool in keys:
        o, op, f, v, c = (column_rows(results, tp, pool, x)
                          for x in ("ours", "ours_pdl", "fi", "vllm", "copy"))
        for B in sorted(set(o) | set(f) | set(v)):
            # ours against a plain copy of the same state bytes at this B: the bar a kernel
            # that moves them can reach, launch and tail included
            same = (f"{100 * c[B]['ms'] / o[B]['ms']:6.1f}%" if "ms" in c.get(B, {})
                    and "ms" in o.get(B, {}) else f"{'':>7}")
            print(f"{tp:>3} {pool:>5} {B:>5} | {_cell(o.get(B), copy, False)} | "
                  f"{_cell(op.get(B), copy, False)} | {_cell(f.get(B), copy)} | {_cell(v.get(B), copy)} | "
                  f"{_cell(c.get(B), copy, False)} {same}")
            for name, r in (("ours", o.get(B)), ("ours+PDL", op.get(B)), ("FlashInfer", f.get(B)),
                            ("vLLM", v.get(B))):
                if r is not None and "error" in r:
                    failures.append(f"tp{tp} {pool} B={B} {name}: {r['error']}")
                elif r is not None and r.get("note") and not name.startswith("ours"):
                    failures.append(f"tp{tp} {pool} B={B} {name}: ran with {r['note']} "
                                    f"(first: {'; '.join(r.get('earlier_errors', []))[:200]})")
    for line in failures:
        print("  " + line)
    worst = {}
    for r in cols:
        for key in ("rel_diff_out", "rel_diff_state"):
            if isinstance(r.get(key), float):
                k = (r["column"], r["pool"], key)
                worst[k] = max(worst.get(k, 0.0), r[key])
    if worst:
        print("largest rel diff to ours over B and tp (out / written states): " + "; ".join(
            f"{c} {p} {worst.get((c, p, 'rel_diff_out'), float('nan')):.1e} / "
            f"{worst.get((c, p, 'rel_diff_state'), float('nan')):.1e}"
            for c, p in sorted({(c, p) for c, p, _ in worst})))
    for key, name in (("bf16_sweep", "bf16 sweep"), ("fp32_nsub_sweep", "fp32 nsub sweep")):
        sw = [r for r in results.get(key, []) if "TBps" in r]
        for B in sorted({r["B"] for r in sw}):
            best = sorted((r for r in sw if r["B"] == B), key=lambda r: -r["TBps"])[:5]
            print(f"{name} B={B} (best 5 of {sum(r['B'] == B for r in sw)}): " + ", ".join(
                f"{_sweep_cfg(r)} {100 * r['TBps'] / copy:.1f}%" for r in best))
        for r in results.get(key, []):
            if "error" in r:
                print(f"  {name} B={r['B']} {_sweep_cfg(r)} failed: {r['error'][:150]}")
            elif isinstance(r.get("rel_diff_out"), float) and r["rel_diff_out"] > 1e-2:
                print(f"  {name} B={r['B']} {_sweep_cfg(r)}: out differs from the default "
                      f"config by {r['rel_diff_out']:.1e}")


def print_table(results):
    copy = results["copy"]["TBps"]
    fla = {r["B"]: r for r in results.get("fla", []) if "TBps" in r}
    print(f"\ndevice copy bandwidth: {copy:.3f} TB/s   ({results['device']})")
    if results.get("ours"):
        print("ours in detail, TP 1 (HV 32), fp32 pool")
        hdr = (f"{'B':>5} {'cfg':>7} {'us/layer':>9} {'TB/s':>6} {'%copy':>6} | {'fla us':>8} "
               f"{'fla %':>6} | {'eager ms':>9} {'graph ms':>9} {'x':>6} {'pools':>5}")
        print(hdr)
        print("-" * len(hdr))
    for r in results.get("ours", []):
        f = fla.get(r["B"])
        fs = f"{f['ms'] * 1e3:8.1f} {100 * f['TBps'] / copy:5.1f}%" if f else f"{'-':>8} {'-':>6}"
        st = (f"{r['stack_eager_ms']:9.3f} {r['stack_graph_ms']:9.3f} {r['stack_speedup']:6.1f}"
              if "stack_eager_ms" in r else f"{'-':>9} {'-':>9} {'-':>6}")
        print(f"{r['B']:>5} {r['config'][0]:>3}/{r['config'][1]:<3} {r['ms'] * 1e3:9.1f} "
              f"{r['TBps']:6.2f} {100 * r['TBps'] / copy:5.1f}% | {fs} | {st} {r['pools']:>5}")
    for B, best in results.get("sweep_best", {}).items():
        print(f"sweep B={B}: best BV={best['BV']} num_warps={best['num_warps']} "
              f"{best['TBps']:.2f} TB/s ({100 * best['TBps'] / copy:.1f}% of copy)")
    for r in results.get("ours", []):
        if "ms_pdl" in r:
            print(f"B={r['B']:>5} with pdl: {r['ms_pdl'] * 1e3:7.1f} us/layer "
                  f"({100 * r['TBps_pdl'] / copy:5.1f}% of copy), stack graph "
                  f"{r['stack_graph_pdl_ms']:.3f} ms ({r['stack_speedup_pdl']:.1f}x eager)")
    s1, s1p = results.get("graph_speedup_B1"), results.get("graph_speedup_B1_pdl")
    if s1 is not None and s1p is not None:
        print(f"graph/eager speedup of the {LAYERS}-layer stack at B=1: {s1:.1f}x, "
              f"{s1p:.1f}x with pdl (goal >= 20x)")
    fl = results.get("latency_floor_B1")
    if fl:
        print(f"{LAYERS} launches at B=1's grid in one graph: empty kernel "
              f"{fl['stack_graph_empty_ms'] * 1e3:.1f} us, slot->state copy kernel "
              f"{fl['stack_graph_slot_copy_ms'] * 1e3:.1f} us")
    print_columns(results)
    for name in ("fla", "fi", "vllm"):
        if results.get(f"{name}_error"):
            print(f"{name}: {results[f'{name}_error']}")


def _dry_run_setup():
    """Tiny shapes on the CPU under the Triton interpreter: exercises the bookkeeping of every
    column (a test hands in stand-ins for FlashInfer and vLLM through load_fi_decode /
    load_vllm_decode), without graphs, timers that mean anything, PDL or fla."""
    import os
    global DEVICE, TP_HEADS, K, V, LAYERS, BATCHES, BATCHES_TP2, SWEEP_B, SWEEP, SWEEP_QUICK
    global BF16_SWEEP_B, BF16_SWEEP, BF16_SWEEP_QUICK, BF16_SWEEP_MAXNREG, MIN_LAUNCHES
    global NSUB_SWEEP, NSUB_SWEEP_B
    os.environ["TRITON_INTERPRET"] = "1"
    DEVICE = "cpu"
    TP_HEADS = {1: (1, 2), 2: (1, 1)}
    K = V = 32
    LAYERS = 3
    BATCHES, BATCHES_TP2, SWEEP_B, BF16_SWEEP_B = (1, 4), (4,), (4,), (4,)
    SWEEP = SWEEP_QUICK = [(4, 1), (8, 1)]
    BF16_SWEEP = BF16_SWEEP_QUICK = [(8, 1), (16, 2)]
    BF16_SWEEP_MAXNREG = []
    NSUB_SWEEP, NSUB_SWEEP_B = [(4, 1, 2)], (4,)
    MIN_LAUNCHES = 2
    set_tp(1)


def _load_optional(args, name, loader):
    if name not in args.only:
        return None, f"skipped (not in --only / --no-{name})"
    if args.cpu_dry_run and not getattr(loader, "dry_run_ok", False):
        return None, "skipped (--cpu-dry-run)"
    return loader()


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        results = json.loads(args.replot.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        return 0 if plot(args.out / "bench_decode.png", results, results["copy"]["TBps"]) else 1
    if args.cpu_dry_run:
        _dry_run_setup()
    import torch
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_decode: needs a CUDA GPU (or --cpu-dry-run)", file=sys.stderr)
        return 2
    import triton
    from gdn_graphs.ops.decode import default_config, gdn_decode

    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    bench = (DryBench if args.cpu_dry_run else Bench)(torch, triton, args.quick)
    scale = 2 if args.quick else 1
    target = GiB // scale                       # state bytes touched per timed replay
    budget = (40 * GiB) // scale                # state memory allocated at once
    if args.cpu_dry_run:
        target, budget = 1 << 18, 1 << 22
    set_tp(1)
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
        "torch": torch.__version__, "triton": triton.__version__,
        "shapes": {"HK": HK, "HV": HV, "K": K, "V": V, "layers": LAYERS,
                   "inputs": "bfloat16", "state": "float32",
                   "heads": {f"tp{tp}": dict(HK=TP_HEADS[tp][0], HV=TP_HEADS[tp][1]) for tp in args.tp}},
        "quick": args.quick, "target_touched_bytes": target, "budget_bytes": budget,
        "tp": args.tp, "pools": args.pools, "only": args.only,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    results["copy"] = copy_bandwidth(bench, (2 * GiB) // scale if DEVICE == "cuda" else 1 << 20)
    copy = results["copy"]["TBps"]
    print(f"copy bandwidth {copy:.3f} TB/s", flush=True)

    fla_fn, results["fla_error"] = _load_optional(args, "fla", load_fla)
    fi, results["fi_error"] = _load_optional(args, "fi", load_fi_decode)
    if fi is not None:
        results["fi_version"] = fi["version"]
    vl, results["vllm_error"] = _load_optional(args, "vllm", load_vllm_decode)
    if vl is not None:
        results["vllm_version"], results["vllm_module"] = vl["version"], vl["module"]
    for name, val in (("fla", fla_fn), ("fi", fi), ("vllm", vl)):
        print(f"{name}: " + ("yes" if val is not None else results[f"{name}_error"]), flush=True)

    # ours in detail at TP 1 with fp32 pools (and fla, which has no slots, against it)
    ours, fla = [], []
    json_path = args.out / "bench_decode.json"
    if 1 in args.tp and "fp32" in args.pools and ("ours" in args.only or fla_fn is not None):
        sweep = [] if args.no_sweep else (SWEEP_QUICK if args.quick else SWEEP)
        for B in progress(args.batches or BATCHES, desc="batch"):
            r, check = bench_ours(bench, gdn_decode, B, budget, target, sweep if B in SWEEP_B else [],
                                  detail=not args.no_stack)
            r["config"] = default_config(K, V, B, torch.float32)
            r["ratio_to_copy"] = r["TBps"] / copy
            ours.append(r)
            print(f"B={B}: {r['ms'] * 1e3:.1f} us/layer, {r['TBps']:.2f} TB/s "
                  f"({100 * r['ratio_to_copy']:.1f}% of copy)" +
                  (f"; stack eager {r['stack_eager_ms']:.3f} ms, graph {r['stack_graph_ms']:.3f} ms"
                   if "stack_eager_ms" in r else ""), flush=True)
            if fla_fn is not None:
                try:
                    f = bench_fla(bench, fla_fn, B, budget, target, check)
                    f["ratio_to_copy"] = f["TBps"] / copy
                    fla.append(f)
                except Exception as e:  # noqa: BLE001 - report, keep going
                    fla.append({"B": B, "error": repr(e)[:300]})
                    results["fla_error"] = results["fla_error"] or repr(e)[:300]
            del check
            release(torch)
    results["ours"], results["fla"] = ours, fla
    results["sweep_best"] = {}
    for r in ours:
        ok = [s for s in r["sweep"] if "TBps" in s]
        if ok:
            best = max(ok, key=lambda s: s["TBps"])
            results["sweep_best"][r["B"]] = dict(best, ratio_to_copy=best["TBps"] / copy)
    b1 = [r for r in ours if r["B"] == 1]
    results["graph_speedup_B1"] = b1[0].get("stack_speedup") if b1 else None
    results["graph_speedup_B1_pdl"] = b1[0].get("stack_speedup_pdl") if b1 else None
    if DEVICE == "cuda" and not args.no_stack and 1 in args.tp and "ours" in args.only:
        results["latency_floor_B1"] = latency_floor(bench, 1)
    json_path.write_text(json.dumps(results, indent=1, default=str))  # kept if a later step dies

    # the columns side by side: ours, FlashInfer, vLLM; fp32 and bf16 pools; TP 1 and 2
    print("columns (ours / FlashInfer / vLLM, fp32 / bf16 pools, TP 1 / 2)", flush=True)
    results["columns"] = run_columns(bench, torch, gdn_decode, args, fi, vl, budget, target, copy,
                                     {r["B"]: r for r in ours})
    json_path.write_text(json.dumps(results, indent=1, default=str))
    if not args.no_sweep and 1 in args.tp and "bf16" in args.pools and "ours" in args.only:
        print("bf16-pool sweep of ours (BV, num_warps)", flush=True)
        results["bf16_sweep"] = run_bf16_sweep(bench, torch, gdn_decode, args, budget, target, copy)
    if not args.no_sweep and 1 in args.tp and "fp32" in args.pools and "ours" in args.only:
        print("fp32-pool sweep of ours' tiles per program (nsub)", flush=True)
        results["fp32_nsub_sweep"] = run_nsub_sweep_fp32(bench, torch, gdn_decode, args, budget,
                                                         target, copy)

    print_table(results)
    json_path.write_text(json.dumps(results, indent=1, default=str))
    png = args.out / "bench_decode.png"
    wrote_png = plot(png, results, copy)
    print(f"wrote {json_path}" + (f" and {png}" if wrote_png else " (no matplotlib: no plot)"))
    return results if argv is not None else 0


if __name__ == "__main__":
    sys.exit(main())
