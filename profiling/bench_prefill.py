"""Benchmark the chunked GDN prefill (gdn_chunk_prefill) on the device (Qwen3-Next shapes).

    python3 profiling/bench_prefill.py --out DIR [--quick] [--no-fla]

Shapes: HK 16, HV 32, K = V = 128, bf16 inputs, fp32 pool; batches 1x8192, 8x2048, 4x16384 (every
sequence fresh: read slot -1). Checkpoints off (no block boundary inside any span), on with B = 256
and on with B = 1024 (each checkpoint into its own slot). It reports
  * M tokens/s per layer: median of triton.testing.do_bench over the whole call (both kernels,
    persistent out and workspace as under a CUDA graph), plus each kernel alone;
  * checkpoint cost: time with checkpoints / time without - 1, in %;
  * peak extra memory of one call that allocates its own out and workspace
    (torch.cuda.max_memory_allocated delta), and the workspace size;
  * fla-core's chunk_gated_delta_rule side by side when it imports (given the log decay g and
    beta = sigmoid(b) precomputed, use_qk_l2norm_in_kernel=True, cu_seqlens, final states out; it
    stores no block states), with the relative difference of its outputs and final states to ours;
  * a sweep of the launch knobs (ChunkConfig: bv, warps_seq, stages; warps_intra on the parallel
    kernel alone) on 1x8192 with B = 256, the best three re-timed on the other two shapes.
Prints a table last; writes DIR/bench_prefill.json (date, commit, device, numbers) and
DIR/bench_prefill.png (if matplotlib imports). About 1-2.5 minutes on an H200 (less with --quick).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HK, HV, K, V = 16, 32, 128, 128
SHAPES = [(1, 8192), (8, 2048), (4, 16384)]
MODES = [("off", None), ("B=256", 256), ("B=1024", 1024)]
# a multiple of 64 beyond every position and below the kernels' cap on positions and block sizes
# (gdn_graphs.ops.common.MAX_POS = 2**30, not imported here: triton must load after --cpu-dry-run)
OFF_BLOCK = (1 << 30) - 64
SWEEP = [dict(bv=bv, warps_seq=w, stages=s) for bv in (16, 32, 64) for w in (4, 8) for s in (2, 3)]
SWEEP_QUICK = [dict(bv=bv, warps_seq=4, stages=s) for bv in (32, 64) for s in (2, 3)]
MiB = 1 << 20
DEVICE = "cuda"  # --cpu-dry-run switches to the CPU (Triton interpreter) and tiny shapes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, type=Path, help="directory for bench_prefill.json / .png")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and a smaller knob sweep")
    p.add_argument("--no-fla", action="store_true", help="skip the fla-core comparison")
    p.add_argument("--no-sweep", action="store_true", help="skip the launch-knob sweep")
    p.add_argument("--sweep-only", action="store_true", help="only the launch-knob sweep")
    p.add_argument("--sweep-worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="check the bookkeeping on the CPU (Triton interpreter, tiny shapes, wall-clock "
                        "timer, no fla); the numbers mean nothing")
    return p.parse_args(argv)


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception as e:  # noqa: BLE001 - no git is not fatal
        return f"unknown ({e.__class__.__name__})"


def log(msg, t0=[time.time()]):  # noqa: B006 - a start time shared by all calls
    print(f"[{time.time() - t0[0]:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------

class Case:
    """Inputs, pool, metas (one per checkpoint mode), persistent out and workspace for one shape."""

    def __init__(self, torch, nseq, L, seed=0):
        from gdn_graphs.ops.chunk import ChunkWorkspace
        from gdn_graphs.ops.meta import chunk_meta, num_checkpoints

        self.nseq, self.L, self.T = nseq, L, nseq * L
        dev = DEVICE
        gen = torch.Generator(device=dev).manual_seed(seed)
        T = self.T
        bf = torch.bfloat16
        # q, k, v as views of one packed projection output, as a model would pass them
        qkv = torch.randn(T, 2 * HK * K + HV * V, device=dev, generator=gen, dtype=bf)
        self.q = qkv[:, :HK * K].unflatten(1, (HK, K))
        self.k = qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
        self.v = qkv[:, 2 * HK * K:].unflatten(1, (HV, V))
        ab = torch.randn(T, 2 * HV, device=dev, generator=gen, dtype=bf)
        self.a, self.b = ab[:, :HV], ab[:, HV:]
        self.A_log = torch.log(torch.empty(HV, device=dev).uniform_(1, 16, generator=gen))
        self.dt_bias = torch.randn(HV, device=dev, generator=gen) * 0.5
        need = max(num_checkpoints(0, L, B or OFF_BLOCK) for _, B in MODES) + 1
        self.pool = torch.zeros(nseq * need, HV, V, K, device=dev)
        self.metas = {}
        for name, B in MODES:
            Bk = B or OFF_BLOCK
            nck = num_checkpoints(0, L, Bk)
            writes = [i * need for i in range(nseq)]
            ckpts = [[i * need + 1 + e for e in range(nck)] for i in range(nseq)]
            self.metas[name] = chunk_meta([L] * nseq, [0] * nseq, [-1] * nseq, writes, ckpts, Bk, device=dev)
        self.out = torch.empty(T, HV, V, device=dev, dtype=bf)
        self.ws = ChunkWorkspace(T, HV, K, V, bf, dev, HK=HK)

    def args(self):
        return (self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias, self.pool)


def bench_ms(triton, fn, quick):
    fn()  # compile outside the timed region
    if DEVICE == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100,
                                   return_mode="median")


def peak_extra_mib(torch, fn):
    if DEVICE == "cpu":
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / MiB
    del res
    torch.cuda.empty_cache()
    return extra


def mtok(T, ms):
    return T / (ms * 1e-3) / 1e6


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------

def bench_ours(torch, triton, case, quick, cfg=None):
    from gdn_graphs.ops.chunk import DEFAULT_CONFIG, chunk_intra_fwd, chunk_seq_fwd, gdn_chunk_prefill

    cfg = cfg or DEFAULT_CONFIG
    res = {}
    for name, _ in MODES:
        meta = case.metas[name]

        def intra():
            return chunk_intra_fwd(
                case.q, case.k, case.v, case.a, case.b, case.A_log, case.dt_bias, case.out, case.ws,
                meta, K ** -0.5, num_warps=cfg.warps_intra, dot_precision="tf32", inv_precision="tf32")

        def call():
            gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)

        ms = bench_ms(triton, call, quick)
        ms_intra = bench_ms(triton, intra, quick)
        ck = intra()
        ms_seq = bench_ms(triton, lambda: chunk_seq_fwd(
            case.out, case.pool, case.ws, meta, HK, bv=cfg.bv, num_warps=cfg.warps_seq,
            num_stages=cfg.stages_for(torch.bfloat16), dot_precision="tf32"), quick)
        res[name] = dict(ms=ms, Mtok_s=mtok(case.T, ms), ms_intra=ms_intra, ms_seq=ms_seq,
                         checkpoints=int(meta.ckpt_offsets[-1].item()),
                         intra_regs=getattr(ck, "n_regs", None), intra_spills=getattr(ck, "n_spills", None))
    off = res["off"]["ms"]
    for name, _ in MODES[1:]:
        res[name]["ckpt_cost_pct"] = 100.0 * (res[name]["ms"] / off - 1.0)
    meta = case.metas["B=256"]
    res["peak_extra_MiB"] = peak_extra_mib(torch, lambda: gdn_chunk_prefill(*case.args(), meta, config=cfg))
    res["workspace_MiB"] = case.ws.nbytes() / MiB
    return res


# ---------------------------------------------------------------------------------------------
# fla-core
# ---------------------------------------------------------------------------------------------

def load_fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule, None
    except Exception as e:  # noqa: BLE001 - optional
        return None, f"{e.__class__.__name__}: {e}"


def bench_fla(torch, triton, fla_fn, case, quick):
    import torch.nn.functional as F
    T = case.T
    # contiguous copies made here, outside the timing: fla would copy our packed views itself
    q = case.q.contiguous().unsqueeze(0)
    k = case.k.contiguous().unsqueeze(0)
    v = case.v.contiguous().unsqueeze(0)
    g = (-torch.exp(case.A_log) * F.softplus(case.a.float() + case.dt_bias)).unsqueeze(0)
    beta = torch.sigmoid(case.b.float()).to(case.b.dtype).unsqueeze(0)
    cu = torch.arange(0, T + 1, case.L, device=DEVICE, dtype=torch.long)
    kw = dict(scale=K ** -0.5, initial_state=None, output_final_state=True,
              use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    if "cu_seqlens_cpu" in inspect.signature(fla_fn).parameters:
        kw["cu_seqlens_cpu"] = cu.cpu()

    def call():
        return fla_fn(q, k, v, g, beta, **kw)

    for _ in range(3):  # its autotuner runs on the first calls
        call()
    ms = bench_ms(triton, call, quick)
    o, ht = call()
    res = dict(ms=ms, Mtok_s=mtok(T, ms), peak_extra_MiB=peak_extra_mib(torch, call))
    # agreement with ours (no checkpoints; FLA's state is [N, HV, K, V], ours [V, K] per head)
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    meta = case.metas["off"]
    gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws)
    ours_state = torch.stack([case.pool[int(s)] for s in meta.write_slot.tolist()])
    rel = lambda x, y: ((x.float() - y.float()).norm() / y.float().norm()).item()  # noqa: E731
    res["rel_diff_out"] = rel(case.out, o[0])
    res["rel_diff_state"] = rel(ours_state, ht.transpose(-1, -2))
    return res


# ---------------------------------------------------------------------------------------------
# knob sweep
# ---------------------------------------------------------------------------------------------

def sweep_worker(torch, triton, start, quick, jsonl: Path):
    """Time and check the knob configs from index ``start`` on (1x8192, B = 256), one JSON line each.

    Runs in a child process: a config that crashes the CUDA context (an illegal access would poison
    every later launch) then costs only its own line; the parent restarts after it. Each config's
    output is compared with the default config's (a miscompiled config must not win the sweep)."""
    from gdn_graphs.ops.chunk import DEFAULT_CONFIG, ChunkConfig, gdn_chunk_prefill

    case = Case(torch, *SHAPES[0])
    meta = case.metas["B=256"]
    gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=DEFAULT_CONFIG)
    ref = case.out.float().clone()
    knobs_all = SWEEP_QUICK if quick else SWEEP
    for i in range(start, len(knobs_all)):
        knobs = knobs_all[i]
        row = dict(knobs, index=i)
        try:
            cfg = ChunkConfig(**knobs)
            case.out.fill_(float("nan"))
            gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)
            torch.cuda.synchronize() if DEVICE == "cuda" else None
            row["rel_diff_vs_default"] = float((case.out.float() - ref).norm() / ref.norm())
            ms = bench_ms(triton, lambda: gdn_chunk_prefill(*case.args(), meta, out=case.out,
                                                            workspace=case.ws, config=cfg), quick)
            row.update(ms=ms, Mtok_s=mtok(case.T, ms))
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
            row["error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if "CUDA error" in row.get("error", ""):
            sys.exit(3)  # the context is dead: the parent restarts after this config


def sweep(args):
    """Run sweep_worker in child processes until every config has a line; returns the rows."""
    jsonl = args.out / "bench_prefill_sweep.jsonl"
    jsonl.unlink(missing_ok=True)
    n = len(SWEEP_QUICK if args.quick else SWEEP)
    start = 0
    while start < n:
        cmd = [sys.executable, __file__, "--out", str(args.out), "--sweep-worker", str(start)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--cpu-dry-run"] if args.cpu_dry_run else []
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
        done = len(rows)
        if done < n and proc.returncode not in (0, 3):  # config `done` killed the worker: record it
            knobs = (SWEEP_QUICK if args.quick else SWEEP)[done]
            err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            with jsonl.open("a") as f:
                f.write(json.dumps(dict(knobs, index=done, error=f"worker died: {err}")) + "\n")
            done += 1
        if done <= start:
            break
        start = done
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return dict(shape=f"{SHAPES[0][0]}x{SHAPES[0][1]}", mode="B=256", seq=rows)


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------

def plot(path, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - optional
        return False
    shapes = list(results["shapes"])
    series = [(f"ours, ckpt {m}", lambda s, m=m: results["shapes"][s]["ours"][m]["Mtok_s"]) for m, _ in MODES]
    if any("fla" in results["shapes"][s] and "Mtok_s" in results["shapes"][s]["fla"] for s in shapes):
        series.append(("fla chunk_gated_delta_rule (no ckpt)",
                       lambda s: results["shapes"][s].get("fla", {}).get("Mtok_s", 0.0)))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw=dict(width_ratios=[1.2, 1]))
    ax = axes[0]
    w = 0.8 / len(series)
    for i, (label, f) in enumerate(series):
        xs = [j + i * w for j in range(len(shapes))]
        ax.bar(xs, [f(s) for s in shapes], w, label=label)
    ax.axhline(16, color="k", ls="--", lw=0.8, label="goal 16 M tok/s")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))])
    ax.set_xticklabels(shapes)
    ax.set_ylabel("M tokens/s per layer")
    ax.set_title(f"GDN chunked prefill, HV {HV}, K = V = {K}, bf16 ({results['device']})", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    rows = [r for r in results.get("sweep", {}).get("seq", []) if "Mtok_s" in r]
    ax.bar(range(len(rows)), [r["Mtok_s"] for r in rows])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"bv{r['bv']} w{r['warps_seq']} s{r['stages']}" for r in rows], rotation=70, fontsize=7)
    ax.set_ylabel("M tokens/s (1x8192, B = 256)")
    ax.set_title("launch-knob sweep", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def print_table(results, sweep_only=False):
    if sweep_only:
        return _print_sweep(results)
    print()
    print(f"GDN chunked prefill, HK {HK}, HV {HV}, K = V = {K}, bf16 inputs, fp32 pool -- {results['device']}")
    hdr = (f"{'shape':>8} {'mode':>7} {'ms':>8} {'Mtok/s':>8} {'intra ms':>9} {'seq ms':>8} {'ckpts':>6} "
           f"{'ckpt cost':>9}")
    print(hdr)
    print("-" * len(hdr))
    for shape, r in results["shapes"].items():
        for m, _ in MODES:
            o = r["ours"][m]
            cost = f"{o['ckpt_cost_pct']:+8.2f}%" if "ckpt_cost_pct" in o else ""
            print(f"{shape:>8} {m:>7} {o['ms']:8.3f} {o['Mtok_s']:8.2f} {o['ms_intra']:9.3f} {o['ms_seq']:8.3f} "
                  f"{o['checkpoints']:6d} {cost:>9}")
        f = r.get("fla")
        if f and "ms" in f:
            print(f"{shape:>8} {'fla':>7} {f['ms']:8.3f} {f['Mtok_s']:8.2f}   (rel diff to ours: out "
                  f"{f['rel_diff_out']:.1e}, state {f['rel_diff_state']:.1e}; "
                  f"peak extra {f['peak_extra_MiB']:.0f} MiB)")
        elif f:
            print(f"{shape:>8} {'fla':>7} failed: {f.get('error')}")
        print(f"{shape:>8} ours peak extra memory per call {r['ours']['peak_extra_MiB']:.0f} MiB "
              f"(workspace {r['ours']['workspace_MiB']:.0f} MiB)")
    if results.get("fla_error"):
        print(f"fla-core not compared: {results['fla_error']}")
    _print_sweep(results)


def _print_sweep(results):
    sw = results.get("sweep")
    if not sw:
        return
    print(f"\nknob sweep, {sw['shape']} B=256 (best first; rel diff of out vs the default config):")
    for r in sorted(sw["seq"], key=lambda r: r.get("ms", 1e9))[:8]:
        print(f"  bv {r['bv']:3d} warps_intra {r.get('warps_intra', '-')} warps_seq {r['warps_seq']} "
              f"stages {r['stages']}: " + (f"{r['ms']:.3f} ms {r['Mtok_s']:.2f} Mtok/s "
                                          f"(diff {r['rel_diff_vs_default']:.1e})" if "ms" in r else r["error"]))


def _dry_run_setup():
    """Tiny shapes on the CPU under the Triton interpreter: exercises every code path of this
    script except the GPU timers, the memory counters and fla."""
    import os
    global DEVICE, HK, HV, K, V, SHAPES, MODES, SWEEP, SWEEP_QUICK
    os.environ["TRITON_INTERPRET"] = "1"
    DEVICE = "cpu"
    HK, HV, K, V = 1, 2, 32, 32
    SHAPES = [(1, 192), (2, 64), (1, 256)]
    MODES = [("off", None), ("B=256", 64), ("B=1024", 128)]
    SWEEP = SWEEP_QUICK = [dict(bv=16, warps_seq=4, stages=2), dict(bv=32, warps_seq=4, stages=3)]


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_dry_run:
        _dry_run_setup()
    import torch
    import triton

    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_prefill needs a CUDA GPU (or --cpu-dry-run)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sweep_worker is not None:
        torch.set_grad_enabled(False)
        return sweep_worker(torch, triton, args.sweep_worker, args.quick, args.out / "bench_prefill_sweep.jsonl")
    if args.sweep_only:
        sw = sweep(args)
        (args.out / "bench_prefill_sweep.json").write_text(json.dumps(sw, indent=1))
        return print_table(dict(shapes={}, sweep=sw, device="", fla_error=None), sweep_only=True)
    from gdn_graphs.ops.chunk import DEFAULT_CONFIG
    results = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"), commit=git_commit(),
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
        torch=torch.__version__, triton=triton.__version__,
        dims=dict(HK=HK, HV=HV, K=K, V=V, dtype="bfloat16", pool="float32"),
        default_config=DEFAULT_CONFIG.__dict__, quick=args.quick, shapes={},
    )
    fla_fn, fla_err = (None, "skipped (--no-fla)") if args.no_fla or args.cpu_dry_run else load_fla()
    if fla_fn is not None:
        try:
            import fla
            results["fla_version"] = getattr(fla, "__version__", "?")
        except Exception:  # noqa: BLE001
            pass
    results["fla_error"] = fla_err
    torch.set_grad_enabled(False)
    cases = {}
    for nseq, L in SHAPES:
        name = f"{nseq}x{L}"
        case = cases[(nseq, L)] = Case(torch, nseq, L)
        log(f"{name}: ours")
        entry = dict(ours=bench_ours(torch, triton, case, args.quick))
        if fla_fn is not None:
            log(f"{name}: fla")
            try:
                entry["fla"] = bench_fla(torch, triton, fla_fn, case, args.quick)
            except Exception as e:  # noqa: BLE001 - report, do not die
                entry["fla"] = dict(error=f"{e.__class__.__name__}: {str(e)[:300]}")
        results["shapes"][name] = entry
    json_path = args.out / "bench_prefill.json"
    json_path.write_text(json.dumps(results, indent=1, default=str))  # kept if the sweep dies
    del cases
    if not args.no_sweep:
        log("knob sweep (child processes)")
        results["sweep"] = sweep(args)
    log("done")
    json_path.write_text(json.dumps(results, indent=1, default=str))
    png = args.out / "bench_prefill.png"
    wrote = plot(png, results)
    print(f"wrote {json_path}" + (f" and {png}" if wrote else " (no matplotlib: no plot)"))
    print_table(results)


if __name__ == "__main__":
    main()
