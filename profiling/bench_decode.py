"""Benchmark the fused GDN decode kernel on the device (Qwen3-Next shapes).

    python3 profiling/bench_decode.py --out DIR [--quick]

Shapes: HK 16, HV 32, K = V = 128, bf16 inputs, fp32 state (2 MiB per state per layer), read
slots != write slots. For each batch size B it reports
  * per-layer kernel time: median (triton.testing.do_bench) of a CUDA graph that replays M
    launches over distinct pools/slot sets (>= ~1 GiB of state touched per replay, so nothing
    sits in the 60 MB L2), divided by M; bytes = B*HV*K*V*4*2 + inputs and outputs;
    bandwidth and its ratio to the device copy bandwidth measured in the same run;
  * the same for FLA's fused_recurrent_gated_delta_rule (fla-core) if importable, on a gathered
    state tensor (it has no slots);
  * a stack of 36 decode layers, one pool per layer (fewer pools, shared round-robin by the
    layers, where 36 do not fit the memory budget: the JSON says how many), eager vs replayed
    from one CUDA graph, and the speedup;
  * at B = 64 and 256 (and 1, 16 for the small-batch rule), a sweep of (BV, num_warps) with
    the best config.
Prints a table, writes DIR/bench_decode.json and DIR/bench_decode.png (if matplotlib imports).
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

HK, HV, K, V = 16, 32, 128, 128
LAYERS = 36
BATCHES = (1, 4, 16, 64, 256, 1024)
SWEEP_B = (1, 16, 64, 256)  # 64 and 256 set the default; 1 and 16 inform the small-N rule
SWEEP = [(4, 1), (4, 2), (8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4),
         (32, 8), (64, 4), (64, 8)]
SWEEP_QUICK = [(4, 1), (8, 1), (8, 2), (16, 2), (16, 4), (32, 4), (64, 8)]
GiB = 1 << 30
DEVICE = "cuda"  # a CPU dry run of the bookkeeping may override it
STATE_BYTES = HV * K * V * 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="directory for JSON and PNG")
    p.add_argument("--quick", action="store_true",
                   help="half the memory, touched bytes and timing repetitions; a smaller sweep")
    p.add_argument("--no-fla", action="store_true", help="skip the fla-core comparison")
    p.add_argument("--replot", type=Path, metavar="JSON",
                   help="only redraw DIR/bench_decode.png from a recorded bench_decode.json")
    return p.parse_args(argv)


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


def plan_pools(B, budget, target):
    """P pools (layers) of R slot sets each; a set is B read slots + B write slots."""
    per_set = 2 * B * STATE_BYTES
    P = max(1, min(LAYERS, budget // per_set))
    need = max(1, math.ceil(target / per_set))
    R = max(1, min(math.ceil(need / P), max(1, budget // (per_set * P))))
    M = min(P * R, max(8, need))
    return P, R, M


def bench_ours(bench, gdn_decode, B, budget, target, sweep):
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

    # the same launches with programmatic dependent launch (each kernel's slot and state loads
    # overlap the previous kernel)
    fns_pdl = [call(j, pdl=True) for j in range(M)]
    fns_pdl[0]()
    t = bench.per_call_ms(fns_pdl)
    res.update(ms_pdl=t, TBps_pdl=total_bytes / t / 1e9)

    # the layer stack: layer l uses pool l % P (one pool per layer when P == 36)
    stack = [call(l) for l in range(LAYERS)]
    res["stack_eager_ms"] = bench.ms(lambda: [f() for f in stack])
    g = bench.graph(stack)
    res["stack_graph_ms"] = bench.ms(g.replay)
    res["stack_speedup"] = res["stack_eager_ms"] / res["stack_graph_ms"]
    g = bench.graph(fns_pdl[:LAYERS] if M >= LAYERS else [call(l, pdl=True) for l in range(LAYERS)])
    res["stack_graph_pdl_ms"] = bench.ms(g.replay)
    res["stack_speedup_pdl"] = res["stack_eager_ms"] / res["stack_graph_pdl_ms"]
    del g, fns_pdl

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
    del pools, scratch, fns, stack
    release(torch)
    return res, check


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

    BV, nw = default_config(K, V, B, torch.float32)
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
# report
# ---------------------------------------------------------------------------------------------

def plot(path, results, copy_tbps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    Bs = [r["B"] for r in results["ours"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(Bs, [r["TBps"] for r in results["ours"]], "o-", label="gdn_graphs decode")
    if all("TBps_pdl" in r for r in results["ours"]):
        ax1.plot(Bs, [r["TBps_pdl"] for r in results["ours"]], "^-", label="gdn_graphs, PDL")
    fla = [r for r in results.get("fla", []) if "TBps" in r]
    if fla:
        ax1.plot([r["B"] for r in fla], [r["TBps"] for r in fla], "s--",
                 label="fla fused_recurrent")
    ax1.axhline(copy_tbps, color="k", lw=0.8, label=f"device copy {copy_tbps:.2f} TB/s")
    ax1.axhline(0.9 * copy_tbps, color="k", lw=0.8, ls=":", label="90% of copy")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("batch B")
    ax1.set_ylabel("TB/s (read + write)")
    ax1.set_title("per-layer decode bandwidth, fp32 state")
    ax1.legend(fontsize=8)
    ax2.plot(Bs, [r["stack_eager_ms"] for r in results["ours"]], "o-", label="eager")
    ax2.plot(Bs, [r["stack_graph_ms"] for r in results["ours"]], "o-", label="CUDA graph")
    if all("stack_graph_pdl_ms" in r for r in results["ours"]):
        ax2.plot(Bs, [r["stack_graph_pdl_ms"] for r in results["ours"]], "^-",
                 label="CUDA graph, PDL")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("batch B")
    ax2.set_ylabel(f"ms for {LAYERS} layers")
    ax2.set_title(f"{LAYERS}-layer decode stack")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{results['device']}  {results['date']}  {results['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def print_table(results):
    copy = results["copy"]["TBps"]
    fla = {r["B"]: r for r in results.get("fla", []) if "TBps" in r}
    print(f"\ndevice copy bandwidth: {copy:.3f} TB/s   ({results['device']})")
    hdr = (f"{'B':>5} {'cfg':>7} {'us/layer':>9} {'TB/s':>6} {'%copy':>6} | {'fla us':>8} "
           f"{'fla %':>6} | {'eager ms':>9} {'graph ms':>9} {'x':>6} {'pools':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in results["ours"]:
        f = fla.get(r["B"])
        fs = f"{f['ms'] * 1e3:8.1f} {100 * f['TBps'] / copy:5.1f}%" if f else f"{'-':>8} {'-':>6}"
        print(f"{r['B']:>5} {r['config'][0]:>3}/{r['config'][1]:<3} {r['ms'] * 1e3:9.1f} "
              f"{r['TBps']:6.2f} {100 * r['TBps'] / copy:5.1f}% | {fs} | "
              f"{r['stack_eager_ms']:9.3f} {r['stack_graph_ms']:9.3f} {r['stack_speedup']:6.1f} "
              f"{r['pools']:>5}")
    for B, best in results["sweep_best"].items():
        print(f"sweep B={B}: best BV={best['BV']} num_warps={best['num_warps']} "
              f"{best['TBps']:.2f} TB/s ({100 * best['TBps'] / copy:.1f}% of copy)")
    for r in results["ours"]:
        print(f"B={r['B']:>5} with pdl: {r['ms_pdl'] * 1e3:7.1f} us/layer "
              f"({100 * r['TBps_pdl'] / copy:5.1f}% of copy), stack graph "
              f"{r['stack_graph_pdl_ms']:.3f} ms ({r['stack_speedup_pdl']:.1f}x eager)")
    s1, s1p = results.get("graph_speedup_B1"), results.get("graph_speedup_B1_pdl")
    if s1 is not None:
        print(f"graph/eager speedup of the {LAYERS}-layer stack at B=1: {s1:.1f}x, "
              f"{s1p:.1f}x with pdl (goal >= 20x)")
    fl = results.get("latency_floor_B1")
    if fl:
        print(f"{LAYERS} launches at B=1's grid in one graph: empty kernel "
              f"{fl['stack_graph_empty_ms'] * 1e3:.1f} us, slot->state copy kernel "
              f"{fl['stack_graph_slot_copy_ms'] * 1e3:.1f} us")
    if results.get("fla_error"):
        print(f"fla: {results['fla_error']}")


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        results = json.loads(args.replot.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        return 0 if plot(args.out / "bench_decode.png", results, results["copy"]["TBps"]) else 1
    import torch
    if not torch.cuda.is_available():
        print("bench_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton
    from gdn_graphs.ops.decode import default_config, gdn_decode

    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(torch, triton, args.quick)
    scale = 2 if args.quick else 1
    target = GiB // scale                       # state bytes touched per timed replay
    budget = (40 * GiB) // scale                # state memory allocated at once
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__,
        "shapes": {"HK": HK, "HV": HV, "K": K, "V": V, "layers": LAYERS,
                   "inputs": "bfloat16", "state": "float32"},
        "quick": args.quick, "target_touched_bytes": target, "budget_bytes": budget,
    }
    results["copy"] = copy_bandwidth(bench, (2 * GiB) // scale)
    print(f"copy bandwidth {results['copy']['TBps']:.3f} TB/s", flush=True)

    fla_fn, fla_err = (None, "skipped (--no-fla)") if args.no_fla else load_fla()
    results["fla_error"] = fla_err
    ours, fla = [], []
    sweep = SWEEP_QUICK if args.quick else SWEEP
    for B in progress(BATCHES, desc="batch"):
        r, check = bench_ours(bench, gdn_decode, B, budget, target, sweep if B in SWEEP_B else [])
        r["config"] = default_config(K, V, B, torch.float32)
        r["ratio_to_copy"] = r["TBps"] / results["copy"]["TBps"]
        ours.append(r)
        print(f"B={B}: {r['ms'] * 1e3:.1f} us/layer, {r['TBps']:.2f} TB/s "
              f"({100 * r['ratio_to_copy']:.1f}% of copy); stack eager {r['stack_eager_ms']:.3f} "
              f"ms, graph {r['stack_graph_ms']:.3f} ms", flush=True)
        if fla_fn is not None:
            try:
                f = bench_fla(bench, fla_fn, B, budget, target, check)
                f["ratio_to_copy"] = f["TBps"] / results["copy"]["TBps"]
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
            ratio = best["TBps"] / results["copy"]["TBps"]
            results["sweep_best"][r["B"]] = dict(best, ratio_to_copy=ratio)
    b1 = [r for r in ours if r["B"] == 1]
    results["graph_speedup_B1"] = b1[0]["stack_speedup"] if b1 else None
    results["graph_speedup_B1_pdl"] = b1[0]["stack_speedup_pdl"] if b1 else None
    results["latency_floor_B1"] = latency_floor(bench, 1)

    print_table(results)
    json_path = args.out / "bench_decode.json"
    json_path.write_text(json.dumps(results, indent=1, default=str))
    png = args.out / "bench_decode.png"
    wrote_png = plot(png, results, results["copy"]["TBps"])
    print(f"wrote {json_path}" + (f" and {png}" if wrote_png else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
