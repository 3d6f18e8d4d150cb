"""Trace the demo's decode steps: a chrome trace and a PNG of one decode step's kernel timeline.

    python profiling/trace_demo.py --out DIR [--mode full|piecewise|eager] [--preset ...]
                                   [--prompt-len N] [--steps N]

Writes DIR/trace_<mode>.json (open in chrome://tracing or https://ui.perfetto.dev) and
DIR/decode_step_<mode>.png: the kernels (GPU) or operators (CPU) of the middle profiled decode step
on a time axis, one lane per stream / thread, so the launch gaps of eager decode and the packed
kernels of a replayed FULL graph are visible side by side (run it once per mode).

Each decode step is wrapped in ``record_function("decode_step_<i>")``; on a GPU the profiler also
puts that range on the GPU timeline (gpu_user_annotation), which selects the step's kernels.
Kernels inside a replayed CUDA graph are reported by CUPTI individually (torch >= 2.1).

The same with Nsight Systems (NVTX ranges from gdn_graphs.nvtx: engine.step, engine.plan,
engine.forward.*, gdn.plan, gdn.replay.decode.<size>; --cuda-graph-trace=node shows the kernels
inside each graph instead of one block per replay):

    nsys profile -o gdn_demo -t cuda,nvtx,osrt --cuda-graph-trace=node --force-overwrite true \\
        python -m gdn_graphs.engine.cli demo --nvtx --modes eager,full --prompt-repeats 20 --quiet
    nsys stats --report nvtx_sum,cuda_gpu_kern_sum gdn_demo.nsys-rep

On a CPU-only machine the script still runs (tiny preset, kernels under the Triton interpreter,
eager mode): the trace then shows host operators only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path


def main(argv=None) -> int:
    import torch

    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gdn_graphs.engine.engine import Engine, EngineConfig, mode_available
    from gdn_graphs.engine.model import HybridGDNModel, preset

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default=None, help="default: full on a GPU, eager on CPU")
    p.add_argument("--preset", default=None, help="default: qwen3-next on a GPU, tiny on CPU")
    p.add_argument("--dtype", default="bfloat16" if has_gpu else "float32")
    p.add_argument("--prompt-len", type=int, default=2048 if has_gpu else 100)
    p.add_argument("--batch", type=int, default=1, help="concurrent requests (decode batch)")
    p.add_argument("--steps", type=int, default=8 if has_gpu else 3, help="profiled decode steps")
    args = p.parse_args(argv)

    mode = args.mode or ("full" if has_gpu else "eager")
    ok, why = mode_available(mode, "cuda" if has_gpu else "cpu")
    if not ok:
        print(f"mode {mode}: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if has_gpu else "cpu")
    cfg = preset(args.preset or ("qwen3-next" if has_gpu else "tiny"),
                 dtype=getattr(torch, args.dtype))
    model = HybridGDNModel(cfg, device=dev)
    B = 256 if has_gpu else 64
    total = args.prompt_len + args.steps + 8
    eng = Engine(model, EngineConfig(mode=mode, enable_prefix_caching=False, block_size=B,
                                     num_slots=args.batch + 1, max_seqs=max(args.batch, 1),
                                     max_tokens=4096 if has_gpu else 256,
                                     max_model_len=(total // B + 2) * B,
                                     decode_buckets=(1, 2, 4, 8)))
    rng = random.Random(0)
    reqs = [eng.add_request([rng.randrange(cfg.vocab_size) for _ in range(args.prompt_len)],
                            args.steps + 8) for _ in range(args.batch)]
    while any(r.num_computed < len(r.prompt) for r in reqs):  # prefill, not profiled
        eng.step()
    for _ in range(3):                                         # warm decode steps
        eng.step()
    if has_gpu:
        torch.cuda.synchronize()

    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if has_gpu else [])
    with profile(activities=acts) as prof:
        for i in range(args.steps):
            with record_function(f"decode_step_{i}"):
                eng.step()
        if has_gpu:
            torch.cuda.synchronize()
    trace = out / f"trace_{mode}.json"
    prof.export_chrome_trace(str(trace))
    png = out / f"decode_step_{mode}.png"
    n = plot_step(trace, f"decode_step_{args.steps // 2}", png,
                  f"{cfg.num_layers}-layer {args.preset or ('qwen3-next' if has_gpu else 'tiny')} "
                  f"decode step, batch {args.batch}, mode {mode}")
    print(f"wrote {trace} and {png} ({n} events in the plotted step)")
    return 0


def plot_step(trace_path, step_name: str, png_path, title: str) -> int:
    """Draw the events of one decode step from a chrome trace: GPU kernels inside the step's
    gpu_user_annotation if there are any, else the CPU operators inside its CPU range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    gpu_win = [e for e in spans if e.get("cat") == "gpu_user_annotation" and e["name"] == step_name]
    cpu_win = [e for e in spans if e.get("cat") == "user_annotation" and e["name"] == step_name]
    if gpu_win:
        w = gpu_win[0]
        sel = [e for e in spans if e.get("cat") == "kernel"
               and w["ts"] <= e["ts"] <= w["ts"] + w["dur"]]
        lane_of = lambda e: f"stream {e.get('args', {}).get('stream', e.get('tid'))}"
        what = "GPU kernels"
    elif cpu_win:
        w = cpu_win[0]
        tid = w["tid"]
        inside = [e for e in spans if e.get("cat") == "cpu_op" and e.get("tid") == tid
                  and w["ts"] <= e["ts"] and e["ts"] + e["dur"] <= w["ts"] + w["dur"]]
        # top-level operators only (not nested in another selected operator)
        inside.sort(key=lambda e: (e["ts"], -e["dur"]))
        sel, end = [], -1.0
        for e in inside:
            if e["ts"] >= end:
                sel.append(e)
                end = e["ts"] + e["dur"]
        lane_of = lambda e: f"thread {e.get('tid')}"
        what = "CPU operators"
    else:
        raise RuntimeError(f"{step_name} not found in {trace_path}")
    t0 = w["ts"]
    lanes = sorted({lane_of(e) for e in sel})
    fig, ax = plt.subplots(figsize=(14, 1.6 + 0.5 * len(lanes)))
    cmap = plt.get_cmap("turbo")
    names = sorted({e["name"] for e in sel})
    color = {n: cmap((i + 0.5) / len(names)) for i, n in enumerate(names)}
    for e in sel:
        y = lanes.index(lane_of(e))
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"], 0.3) / 1e3)], (y - 0.4, 0.8),
                       facecolors=color[e["name"]], edgecolors="none")
    busy = sum(e["dur"] for e in sel)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("ms since the step began")
    ax.set_title(f"{title}: {len(sel)} {what}, busy {busy / 1e3:.3f} ms of {w['dur'] / 1e3:.3f} ms")
    top = sorted(names, key=lambda n: -sum(e["dur"] for e in sel if e["name"] == n))[:8]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in top],
              labels=[n[:60] for n in top], fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return len(sel)


if __name__ == "__main__":
    sys.exit(main())
