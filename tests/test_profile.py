"""``gdn-graphs profile`` and the NVTX ranges it relies on.

CPU tier: the command on the tiny preset writes the trace, the summary and both PNGs, and the
summary names our kernels and ranges. GPU tier: Nsight Compute, run for real, lists per NVTX range
exactly the kernels that range claims to hold; and the ranges cost nothing measurable on a FULL
graph decode step.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gdn_graphs import nvtx
from gdn_graphs.engine.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def test_profile_command_writes_trace_summary_and_plots(tmp_path, capsys):
    out = tmp_path / "prof"
    assert cli_main(["profile", "--out", str(out), "--prompt-len", "150", "--decode-steps", "2"]) == 0
    for name in ("trace.json", "summary.txt", "summary.json", "decode_step.png", "mixed_step.png"):
        assert (out / name).stat().st_size > 0, name
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"][0] == "prefill" and "mixed" in s["steps"] and s["steps"][-1] == "decode"
    ranges = s["ranges"]
    for name in ("engine.step", "engine.plan", "gdn.plan", "gdn.core", "gdn.core.decode",
                 "gdn.core.prefill"):
        assert ranges[name]["count"] > 0, name
    kernels = {k for k in ranges if k.startswith("kernel:")}
    assert kernels == {"kernel:_conv_decode_kernel", "kernel:_gdn_decode_kernel",
                       "kernel:_conv_prefill_kernel", "kernel:_chunk_intra_kernel",
                       "kernel:_chunk_seq_kernel"}
    # one conv + one recurrence launch per layer in every decode / prefill range
    layers = s["layers"]
    assert ranges["kernel:_gdn_decode_kernel"]["count"] == ranges["gdn.core.decode"]["count"]
    assert ranges["gdn.core.decode"]["count"] % layers == 0
    text = (out / "summary.txt").read_text()
    assert "Triton interpreter" in text and "kernel:_gdn_decode_kernel" in text
    assert "wrote" in capsys.readouterr().out


def test_summary_attributes_kernels_to_the_ranges_that_launched_them():
    """A kernel counts in every range open on the launching thread when it was launched (paired
    by correlation id, also for a graph replay), its own range is the innermost one; a kernel
    launched outside the profiled steps is in no range and no step total."""
    from gdn_graphs.engine.profile import summarize

    def span(name, cat, ts, dur, tid=1, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid,
                "args": args}

    ev = [span("profile.step.0.decode", "user_annotation", 0, 100),
          span("engine.step", "user_annotation", 1, 98),
          span("gdn.core", "user_annotation", 10, 30),
          span("gdn.core.decode", "user_annotation", 12, 20),
          span("cudaLaunchKernel", "cuda_runtime", 14, 1, correlation=7),
          span("cudaLaunchKernel", "cuda_runtime", 35, 1, correlation=8),
          span("cudaLaunchKernel", "cuda_runtime", 150, 1, correlation=9),
          span("_gdn_decode_kernel", "kernel", 60, 4, tid=7, correlation=7),
          span("aten_norm", "kernel", 70, 6, tid=7, correlation=8),
          span("stray", "kernel", 200, 10, tid=7, correlation=9)]
    s = summarize(ev, gpu=True)
    k, r = s["kernels"], s["ranges"]
    assert k["_gdn_decode_kernel"]["range"] == "gdn.core.decode"
    assert k["aten_norm"]["range"] == "gdn.core" and k["stray"]["range"] == ""
    assert r["gdn.core.decode"]["gpu_ms"] == pytest.approx(0.004)
    assert r["gdn.core"]["gpu_ms"] == pytest.approx(0.010)
    assert r["engine.step"]["gpu_ms"] == pytest.approx(0.010)
    assert s["steps_gpu_ms"] == pytest.approx(0.010)
    assert r["gdn.core.decode"]["share_of_steps"] == pytest.approx(0.4)


def _ncu() -> str:
    found = shutil.which("ncu") or next(iter(sorted(
        glob.glob("/usr/local/cuda*/bin/ncu") + glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None)
    if found is None:
        pytest.fail("ncu (Nsight Compute) not found on this GPU machine")
    return found


def ncu_kernels(nvtx_range: str, tmp_path: Path, layers: int = 2) -> list[str]:
    """Kernel names Nsight Compute profiles inside ``nvtx_range`` during a small eager workload
    of ``gdn-graphs profile --nvtx-only`` (the recipe in profiling/README.md)."""
    cmd = [_ncu(), "--nvtx", "--nvtx-include", f"{nvtx_range}/", "--csv", "--page", "raw",
           "--metrics", "gpu__time_duration.sum", sys.executable, "-m", "gdn_graphs.engine.cli",
           "profile", "--nvtx-only", "--out", str(tmp_path / "ncu"), "--mode", "eager",
           "--layers", str(layers), "--prompt-len", "300", "--block-size", "128",
           "--decode-steps", "2"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    names = [r["Kernel Name"] for r in rows if r.get("Kernel Name") and r["ID"].isdigit()]
    (tmp_path / f"ncu_{nvtx_range}.csv").write_text("\n".join(lines))
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("nvtx_range,want", [
    ("gdn.core.decode", {"_conv_decode_kernel", "_gdn_decode_kernel"}),
    ("gdn.core.prefill", {"_conv_prefill_kernel", "INTRA", "_chunk_seq_kernel"}),
])
def test_ncu_lists_exactly_the_kernels_of_each_range(gpu, tmp_path, nvtx_range, want):
    """INTRA: the chunk-parallel kernel the profiled model (bf16, K = V = 128) takes on this GPU,
    the Gluon one on Hopper (chunk.chunk_intra_fwd_for)."""
    from gdn_graphs.ops.chunk_intra_gluon import gluon_intra_supported
    hopper = gluon_intra_supported(torch.empty(1, 1, 128, dtype=torch.bfloat16, device=gpu), 128)
    want = {("_intra_gluon_kernel" if hopper else "_chunk_intra_kernel") if n == "INTRA" else n for n in want}
    names = ncu_kernels(nvtx_range, tmp_path)
    print(f"ncu, range {nvtx_range}: {len(names)} kernels: "
          f"{ {n: names.count(n) for n in sorted(set(names))} }")
    assert set(names) == want
    # every range holds one launch of each of its kernels
    assert len({names.count(n) for n in want}) == 1


@pytest.mark.gpu
def test_ranges_cost_nothing_on_a_full_graph_decode_step(gpu):
    """Median time of a FULL-graph decode step of the qwen3-next preset (bf16, batch 4), NVTX
    ranges off against on (the nvtx package or torch's binding)."""
    from gdn_graphs.engine import Engine, EngineConfig, HybridGDNModel, preset

    model = HybridGDNModel(preset("qwen3-next", dtype=torch.bfloat16), device=gpu)
    eng = Engine(model, EngineConfig(mode="full", enable_prefix_caching=False, block_size=256,
                                     num_slots=8, max_seqs=4, max_tokens=512, max_model_len=2048,
                                     decode_buckets=(4,), progress=False))
    for i in range(4):
        eng.add_request(list(range(1 + i, 200 + i)), 1000)
    while any(r.num_computed < len(r.prompt) for r in eng.running + eng.waiting):
        eng.step()

    def median_step_ms(n=60):
        times = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            eng.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return 1e3 * sorted(times)[n // 2]

    median_step_ms(10)
    off1, on, off2 = median_step_ms(), None, None
    nvtx.enable(True)
    try:
        on = median_step_ms()
    finally:
        nvtx.enable(False)
    off2 = median_step_ms()
    print(f"FULL-graph decode step, qwen3-next bf16, batch 4: ranges off {off1:.3f} / "
          f"{off2:.3f} ms, on {on:.3f} ms")
    noise = abs(off1 - off2) + 0.02 * min(off1, off2)
    assert abs(on - (off1 + off2) / 2) <= noise + 0.05


def test_profile_refuses_full_mode_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without a GPU")  # the GPU tier runs full mode
    with pytest.raises(SystemExit) as e:
        cli_main(["profile", "--out", "/tmp/x", "--mode", "full"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mode" in err[0]
