"""``gdn-graphs profile``: where the time of the embedded engine's steps goes.

A short, representative workload (a warm-up request, not profiled; then a cold prefill, a second
request with the same prompt that hits the prefix cache while the first one decodes, and decode
steps) runs with the NVTX ranges of ``gdn_graphs.nvtx`` switched on, under torch.profiler. Into
the output folder it writes:

    trace.json         Chrome / Perfetto trace (chrome://tracing, https://ui.perfetto.dev)
    summary.txt/.json  per range: count, host time, GPU time, share of the profiled steps; per
                       kernel: count, GPU time, share, the innermost gdn_graphs range holding it
    decode_step.png    the kernels of one decode step on a time axis (GPU), or its operators (CPU)
    mixed_step.png     the same for the step that mixes decode rows and a prefill

``--nvtx-only`` skips torch.profiler and only emits the NVTX ranges (run under Nsight Systems or
Nsight Compute; recipes in profiling/README.md). Without a GPU everything runs on the CPU with
the kernels under the Triton interpreter: the trace then has no GPU kernels, each kernel's
interpreted run is recorded as a CPU range ``kernel:<name>``, and the summary says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
from collections import defaultdict
from pathlib import Path

import torch

from gdn_graphs import nvtx

__all__ = ["add_arguments", "run_profile", "summarize"]

# the ranges the summary reports (gdn_graphs.nvtx lists them) and the steps this module marks
_OURS = ("engine.", "gdn.", "kernel:")
_STEP = "profile.step"


def add_arguments(p: argparse.ArgumentParser, positive, multiple_of_64) -> None:
    gpu = torch.cuda.is_available()
    p.add_argument("--out", required=True, help="folder for trace, summary and PNGs")
    p.add_argument("--preset", default=None, help="model preset (default: qwen3-next on a GPU, "
                                                  "tiny on a CPU)")
    p.add_argument("--layers", type=positive, default=None, help="override the preset's layers")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   default="bfloat16" if gpu else "float32")
    p.add_argument("--mode", choices=("eager", "piecewise", "full"), default=None,
                   help="engine mode (default: full on a GPU, eager on a CPU)")
    p.add_argument("--prompt-len", type=positive, default=2048 if gpu else 150)
    p.add_argument("--block-size", type=multiple_of_64, default=256 if gpu else 64)
    p.add_argument("--decode-steps", type=positive, default=8 if gpu else 3)
    p.add_argument("--nvtx-only", action="store_true",
                   help="NVTX ranges only, no torch.profiler (for an external profiler)")


def run_profile(args, log=print) -> dict:
    """Run the workload; returns the summary (also written to ``args.out``)."""
    from gdn_graphs.engine import Engine, EngineConfig, mode_available
    from gdn_graphs.engine.model import HybridGDNModel, preset

    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    mode = args.mode or ("full" if gpu else "eager")
    ok, why = mode_available(mode, dev)
    if not ok:
        raise SystemExit(f"gdn-graphs profile: --mode {mode} is unavailable here: {why}")
    name = args.preset or ("qwen3-next" if gpu else "tiny")
    over = {"num_layers": args.layers} if args.layers else {}
    cfg = preset(name, dtype=getattr(torch, args.dtype), **over)
    model = HybridGDNModel(cfg, device=dev)
    B, L = args.block_size, args.prompt_len
    max_tokens = max(B, min(4096, -(-L // 64) * 64))
    eng = Engine(model, EngineConfig(
        mode=mode, block_size=B, num_slots=3 * (L // B + 2) + 4, max_seqs=4, max_tokens=max_tokens,
        max_model_len=(L // B + 2) * B + args.decode_steps * 2 + 64, decode_buckets=(1, 2, 4),
        progress=True))
    rng = random.Random(0)
    prompt = [rng.randrange(cfg.vocab_size) for _ in range(L)]
    log(f"gdn-graphs profile: {cfg.num_layers}-layer {name} ({args.dtype}), mode {mode}, "
        f"{L}-token prompt, block {B}, on {'the GPU' if gpu else 'the CPU (Triton interpreter)'}")
    warm = eng.add_request([rng.randrange(cfg.vocab_size) for _ in range(L)], 3)
    while not warm.done:                                  # compiles, graph pools: not profiled
        eng.step()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = []

    def workload():
        a = eng.add_request(prompt, args.decode_steps + 4)
        while a.num_computed < len(a.prompt):             # cold prefill
            steps.append(_step(eng, len(steps)))
        eng.add_request(prompt, args.decode_steps)        # warm hit, next to a's decodes: mixed
        while eng.has_unfinished():
            steps.append(_step(eng, len(steps)))
        if gpu:
            torch.cuda.synchronize()

    if args.nvtx_only:
        nvtx.enable(True)
        try:
            workload()
        finally:
            nvtx.enable(False)
        log(f"ran {len(steps)} steps with NVTX ranges on ({', '.join(sorted(set(steps)))})")
        return {"steps": steps}

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    nvtx.enable(True, backend=_profile_backend())
    try:
        with profile(activities=acts) as prof, _interpreter_kernel_ranges(not gpu):
            workload()
    finally:
        nvtx.enable(False)
    summary = _write_results(prof, out, gpu, steps, log, title=f"{cfg.num_layers}-layer {name}",
                             preset=name, layers=cfg.num_layers, dtype=args.dtype, mode=mode,
                             prompt_len=L, block_size=B)
    return summary


def _write_results(prof, out: Path, gpu: bool, steps: list[str], log, title: str, **facts) -> dict:
    """trace.json, summary.txt/.json and the two step plots from a finished profiler."""
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    summary = summarize(events, gpu=gpu)
    summary.update(facts, device=torch.cuda.get_device_name() if gpu else "cpu", steps=steps)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = format_summary(summary)
    (out / "summary.txt").write_text(table)
    log(table)
    try:
        import matplotlib  # noqa: F401  (the ``profile`` extra)
    except ImportError:
        log("no step plots: they need matplotlib (pip install 'gdn-graphs[profile]')")
        steps = []
    for kind in ("decode", "mixed"):
        idx = next((i for i, k in enumerate(steps) if k == kind and i > 0), None)
        if idx is not None:
            from gdn_graphs.engine.plot import plot_step

            png = out / f"{kind}_step.png"
            n = plot_step(events, f"{_STEP}.{idx}.{kind}", png,
                          f"{title}, {kind} step {idx}, mode {facts['mode']}")
            log(f"wrote {png} ({n} events)")
    log(f"wrote {trace} and {out / 'summary.txt'}")
    return summary


def _step(eng, i: int) -> str:
    """One engine step inside a range named after its index and kind (decode | mixed | prefill)."""
    eng._admit()            # what step() does first (idempotent), so the rows below are its rows
    rows = eng._schedule()
    ones = sum(1 for _, q in rows if q == 1)
    kind = "decode" if rows and ones == len(rows) else ("mixed" if ones else "prefill")
    with torch.profiler.record_function(f"{_STEP}.{i}.{kind}"):
        eng.step()
    return kind


def _profile_backend():
    """Ranges into the torch.profiler trace, and to NVTX too where a profiler could see them."""
    ranges = nvtx.ProfilerRanges()
    if not torch.cuda.is_available():
        return ranges
    try:
        return nvtx.Tee(nvtx.default_backend(), ranges)
    except RuntimeError:
        return ranges


@contextlib.contextmanager
def _interpreter_kernel_ranges(on: bool):
    """Under the Triton interpreter a kernel is a Python call: record each one as a CPU range
    ``kernel:<name>``, so the summary can still name our kernels."""
    if not on:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def recorded(self, *args, **kwargs):
        with torch.profiler.record_function(f"kernel:{self.fn.__name__}"):
            return run(self, *args, **kwargs)

    InterpretedFunction.run = recorded
    try:
        yield
    finally:
        InterpretedFunction.run = run


def kernel_launches(spans: list[dict]) -> list[tuple[dict, dict]]:
    """(kernel, the host call that launched it) pairs, matched by CUPTI's correlation id. A
    kernel replayed from a CUDA graph pairs with the graph launch."""
    launch = {e["args"]["correlation"]: e for e in spans
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    return [(e, launch[e["args"]["correlation"]]) for e in spans if e.get("cat") == "kernel"
            and e.get("args", {}).get("correlation") in launch]


def _open_ranges(host: list[dict], launches: list[tuple[dict, dict]]):
    """For each launch, the host ranges open on its thread at that moment, outermost first (ranges
    of one thread nest properly, so one sweep with a stack per thread finds them)."""
    marks = []
    for i, r in enumerate(host):
        marks.append((r["ts"], 0, i, r.get("tid")))              # open
        marks.append((r["ts"] + r["dur"], 2, i, r.get("tid")))   # close (after launches at ts)
    for j, (_, call) in enumerate(launches):
        marks.append((call["ts"], 1, j, call.get("tid")))
    stacks, found = defaultdict(list), {}
    for _, kind, i, tid in sorted(marks, key=lambda m: (m[0], m[1])):
        if kind == 0:
            stacks[tid].append(i)
        elif kind == 2:
            if i in stacks[tid]:
                stacks[tid].remove(i)
        else:
            found[i] = [host[r] for r in stacks[tid]]
    return found


def summarize(events: list[dict], gpu: bool) -> dict:
    """Per-range and per-kernel totals from a Chrome trace's events (times in ms). A range's GPU
    time is the time of the kernels launched inside it; a kernel's range is the innermost of ours
    open when it was launched."""
    spans = [e for e in events if e.get("ph") == "X"]
    host = [e for e in spans if e.get("cat") == "user_annotation"
            and e["name"].startswith(_OURS + (_STEP,))]
    launches = kernel_launches(spans)
    open_at = _open_ranges(host, launches)
    ranges: dict = defaultdict(lambda: {"count": 0, "host_ms": 0.0, "gpu_ms": 0.0})
    kernels: dict = defaultdict(lambda: {"count": 0, "gpu_ms": 0.0, "range": ""})
    step_host = sum(e["dur"] for e in host if e["name"].startswith(_STEP))
    for e in host:
        if e["name"].startswith(_OURS):
            ranges[e["name"]]["count"] += 1
            ranges[e["name"]]["host_ms"] += e["dur"] / 1e3
    step_dev = total = 0.0
    for j, (kern, _) in enumerate(launches):
        ms = kern["dur"] / 1e3
        total += ms
        k = kernels[kern["name"]]
        k["count"] += 1
        k["gpu_ms"] += ms
        inside = open_at.get(j, [])
        step_dev += ms if any(r["name"].startswith(_STEP) for r in inside) else 0.0
        for name in {r["name"] for r in inside if r["name"].startswith(_OURS)}:
            ranges[name]["gpu_ms"] += ms
        ours = [r["name"] for r in inside if r["name"].startswith(_OURS)]
        if ours and not k["range"]:
            k["range"] = ours[-1]
    for r in ranges.values():
        r["share_of_steps"] = (r["gpu_ms"] / step_dev if gpu and step_dev
                               else r["host_ms"] * 1e3 / max(step_host, 1e-9))
    for k in kernels.values():
        k["share"] = k["gpu_ms"] / total if total else 0.0
    note = ("GPU: host ms is the range's span on the CPU, GPU ms the time of the kernels launched "
            "inside it (CUPTI); share is of the kernels' time in the profiled steps" if gpu else
            "CPU: kernels ran under the Triton interpreter (no GPU kernels in the trace); "
            "'kernel:<name>' ranges are their interpreted runs; share is of the steps' host time")
    return {"note": note, "steps_host_ms": step_host / 1e3, "steps_gpu_ms": step_dev,
            "ranges": dict(sorted(ranges.items())),
            "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["gpu_ms"]))}


def format_summary(s: dict, top: int = 25) -> str:
    lines = [s["note"], f"profiled steps: host {s['steps_host_ms']:.3f} ms, "
                        f"GPU {s['steps_gpu_ms']:.3f} ms", "",
             f"{'range':<28}{'count':>7}{'host ms':>11}{'GPU ms':>10}{'share':>8}"]
    for name, r in s["ranges"].items():
        lines.append(f"{name:<28}{r['count']:>7}{r['host_ms']:>11.3f}{r['gpu_ms']:>10.3f}"
                     f"{100 * r['share_of_steps']:>7.1f}%")
    if s["kernels"]:
        lines += ["", f"{'kernel':<44}{'count':>7}{'GPU ms':>10}{'share':>8}  innermost range"]
        for name, k in list(s["kernels"].items())[:top]:
            lines.append(f"{name[:43]:<44}{k['count']:>7}{k['gpu_ms']:>10.3f}"
                         f"{100 * k['share']:>7.1f}%  {k['range']}")
    return "\n".join(lines) + "\n"
