"""Thirty-sixth stop: which launch config is fastest for ONE prefill sequence (chunk_config gives
it DEFAULT_CONFIG: Triton's sequential kernel, V tile 32), and does each give its bits?

For TP 1 and 2 head counts and one sequence of 8,192 / 32,768 tokens (a state every 256 tokens
into pool slots, as bench_prefill's "B=256"), every config below is run once eagerly (output and
pool compared bit for bit with DEFAULT_CONFIG's), then timed eagerly and replayed from a CUDA graph
(bench_prefill.graph_ms: kept only if a replay gives the eager bits). One JSON line a config into
$OUT_DIR/probe_one_seq.jsonl, a table last.

    PYTHONPATH=.:profiling python3 profiling/results/2026-12-07/s36_gpu/probe_one_seq.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
import triton

import bench_prefill as bp
from gdn_graphs.ops.workspace import ChunkConfig

CONFIGS = {
    "triton bv32 (default)": ChunkConfig(),
    "triton bv16 st2": ChunkConfig(bv=16, stages=2),
    "triton bv16 st3": ChunkConfig(bv=16),
    "triton bv64": ChunkConfig(bv=64),
    "gluon bv64": ChunkConfig(seq_kernel="gluon", bv=64),
    "gluon bv128": ChunkConfig(seq_kernel="gluon", bv=128),
}


def main(out_dir, lens=(8192, 32768)):
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = out_dir / "probe_one_seq.jsonl"
    rows = []
    for tp in (1, 2):
        bp.HK, bp.HV = bp.TP_HEADS[tp]
        for L in lens:
            case = bp.Case(torch, 1, L)
            meta = case.metas["B=256"]
            ref = None
            for name, cfg in CONFIGS.items():
                row = dict(tp=tp, L=L, config=name)
                try:
                    def call():
                        return gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws,
                                                 config=cfg)
                    case.pool.zero_()
                    case.out.fill_(float("nan"))
                    call()
                    torch.cuda.synchronize() if bp.DEVICE == "cuda" else None
                    got = (case.out.clone(), case.pool.clone())
                    if ref is None:
                        ref = got
                    row["same_bits"] = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
                    row["ms"] = bp.bench_ms(triton, call, quick=False)
                    row["ms_graph"] = bp.graph_ms(torch, triton, call, quick=False)
                except Exception as e:  # noqa: BLE001 - record and go on (e.g. shared memory)
                    row["error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
                rows.append(row)
                with lines.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(row, flush=True)
            del case, ref
            torch.cuda.empty_cache()
    print("\none sequence, a state every 256 tokens: ms eager / replayed (x default replayed)")
    for tp in (1, 2):
        for L in lens:
            sel = [r for r in rows if r["tp"] == tp and r["L"] == L]
            base = next((r.get("ms_graph") for r in sel if "default" in r["config"]), None)
            for r in sel:
                if "error" in r:
                    print(f"TP{tp} 1x{L:<6} {r['config']:<22} {r['error'][:90]}")
                    continue
                g = r.get("ms_graph")
                ratio = f"{base / g:.2f}x" if g and base else "-"
                print(f"TP{tp} 1x{L:<6} {r['config']:<22} {r['ms']:.3f} / {g if g is None else round(g, 3)}"
                      f"  {ratio}  same bits {r['same_bits']}")


if __name__ == "__main__":
    if "--cpu-dry-run" in sys.argv:  # tiny heads under the interpreter: the script's own paths
        bp._dry_run_setup()
        CONFIGS = {k: v for k, v in CONFIGS.items() if "gluon" not in k and "64" not in k}
        main(sys.argv[1], lens=(192,))
    else:  # PROBE_LENS=8192 for a short call
        import os
        main(sys.argv[1], lens=tuple(int(x) for x in os.environ.get("PROBE_LENS", "8192,32768").split(",")))
