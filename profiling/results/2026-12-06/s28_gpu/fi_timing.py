"""GPU probe (twenty-eighth stop): is FlashInfer's unstable prefill figure its kernel or its host
time? For each shape, FlashInfer's prefill (no checkpoints, and its checkpoints every 256 tokens)
and ours (a state every 256 tokens into pool slots) timed three ways:

  eager   triton.testing.do_bench over eager calls (what bench_prefill.py reports)
  graph   do_bench over replays of one CUDA graph of the call (the GPU's time, no host work)
  host    wall-clock microseconds of the Python call alone, 50 calls without a synchronise
          (after a drain), i.e. how fast the host can issue it

    PYTHONPATH=.:/tmp/fisite:... python3 profiling/results/2026-12-06/s28_gpu/fi_timing.py  # JSON to $OUT
"""

import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import bench_prefill as bp  # noqa: E402  (profiling/)

from gdn_graphs.ops.chunk import gdn_chunk_prefill  # noqa: E402
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported  # noqa: E402
from gdn_graphs.ops.workspace import chunk_config  # noqa: E402


def eager_ms(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median")


def host_us(fn, n=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def run_case(fi, tp, nseq, L, rows):
    case = bp.Case(torch, nseq, L)
    x = bp.FiInputs(torch, case)
    cfg = chunk_config(nseq, torch.bfloat16, case.HV, gluon_seq_supported(case.v, bp.K))
    fns = {
        "FI off": lambda: bp.fi_call(fi, x),
        "FI ckpt 256": lambda: bp.fi_call(fi, x, "B=256", use_cp=False),
        "ours 256": lambda: gdn_chunk_prefill(*case.args(), case.metas["B=256"], out=case.out,
                                              workspace=case.ws, config=cfg),
    }
    for name, fn in fns.items():
        r = dict(tp=tp, shape=f"{nseq}x{L}", call=name)
        for how, f in (("eager_ms", eager_ms), ("host_us", host_us), ("graph_ms", graph_ms)):
            try:
                r[how] = f(fn)
            except Exception as e:  # noqa: BLE001 - e.g. a call that cannot be captured
                r[how + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(r)
        print(f"TP{tp} {r['shape']:>8} {name:>12} eager {r.get('eager_ms', float('nan')):7.3f} ms  "
              f"graph {r.get('graph_ms', float('nan')):7.3f} ms  host {r.get('host_us', float('nan')):7.1f} us"
              + (f"  {r['graph_ms_error']}" if "graph_ms_error" in r else ""), flush=True)


def main():
    fi, why = bp.load_fi()
    assert fi is not None, why
    print(torch.cuda.get_device_name(), "flashinfer", fi["version"])
    rows = []
    for tp in (1, 2):
        bp.set_tp(tp)
        for nseq, L in ((1, 8192), (8, 2048), (4, 16384)):
            run_case(fi, tp, nseq, L, rows)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "fi_timing.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), flashinfer=fi["version"], rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
