"""Thirty-seventh stop: launch configs of the sequential kernel where few programs run, after
chunk_config took a V tile of 16 for at most 16 (sequence, value head) pairs (FEW_PAIRS_CONFIG).

Cases (heads, sequences x tokens, a state every 256 tokens into pool slots): TP 2 (HV 16) and
TP 4 (HV 8, HK 4) one sequence of 8,192 and two of 4,096 (16 pairs: V tile 16); TP 2 two sequences
of 4,096 (32 pairs: chunk_config takes the Gluon kernel). For each: chunk_config's pick, then the other configs below, each compared bit for
bit with DEFAULT_CONFIG's output and pool and timed eagerly and replayed from a CUDA graph
(bench_prefill.graph_ms keeps a figure only where a replay gives the eager bits). One JSON line a
run into OUT_DIR/probe_configs.jsonl, a table last.

    PYTHONPATH=.:profiling python3 profiling/results/2026-12-08/s37_gpu/probe_configs.py OUT_DIR
    (--cpu-dry-run: tiny heads under the Triton interpreter, Triton configs only)
"""
import json
import sys
from pathlib import Path

import torch
import triton

import bench_prefill as bp
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.workspace import ChunkConfig, chunk_config

CONFIGS = {
    "triton bv32 (default)": ChunkConfig(),
    "triton bv16": ChunkConfig(bv=16),
    "triton bv16 w8": ChunkConfig(bv=16, warps_seq=8),
    "triton bv32 w8": ChunkConfig(bv=32, warps_seq=8),
    "triton bv64": ChunkConfig(bv=64),
    "gluon bv64": ChunkConfig(seq_kernel="gluon", bv=64),
}
CASES = [(2, 1, 8192), (4, 1, 8192), (4, 2, 4096), (2, 2, 4096)]  # (TP, sequences, tokens each)
HEADS = {4: (4, 8)}  # beyond bench_prefill's TP 1 / 2


def main(out_dir, cases=CASES, configs=CONFIGS):
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = out_dir / "probe_configs.jsonl"
    rows = []
    for tp, nseq, L in cases:
        bp.HK, bp.HV = HEADS.get(tp) or bp.TP_HEADS[tp]
        case = bp.Case(torch, nseq, L)
        meta = case.metas["B=256"]
        v = case.args()[2]
        pick = chunk_config(nseq, v.dtype, bp.HV, gluon_seq_supported(v, bp.K))
        named = {"chunk_config's pick": pick, **configs}
        ref = None
        for name, cfg in named.items():
            row = dict(tp=tp, HV=bp.HV, nseq=nseq, L=L, config=name, cfg=repr(cfg))
            try:
                def call():
                    return gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws,
                                             config=cfg)
                case.pool.zero_()
                case.out.fill_(float("nan"))
                call()
                if bp.DEVICE == "cuda":
                    torch.cuda.synchronize()
                got = (case.out.clone(), case.pool.clone())
                if name == "triton bv32 (default)":
                    ref = got
                row["got"] = got
                row["ms"] = bp.bench_ms(triton, call, quick=False)
                row["ms_graph"] = bp.graph_ms(torch, triton, call, quick=False)
            except Exception as e:  # noqa: BLE001 - record and go on
                row["error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
            rows.append(row)
        for row in rows:  # bits against the default, now that it has run
            got = row.pop("got", None)
            if got is not None and ref is not None:
                row["same_bits"] = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
            if "written" not in row:
                row["written"] = True
                with lines.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print({k: v for k, v in row.items() if k not in ("cfg", "written")}, flush=True)
        del case, ref
        if bp.DEVICE == "cuda":
            torch.cuda.empty_cache()
    print("\na state every 256 tokens: ms eager / replayed (x the default, replayed)")
    for tp, nseq, L in cases:
        sel = [r for r in rows if (r["tp"], r["nseq"], r["L"]) == (tp, nseq, L)]
        base = next((r.get("ms_graph") for r in sel if "default" in r["config"]), None)
        for r in sel:
            head = f"TP{tp} {nseq}x{L:<6} {r['config']:<22}"
            if "error" in r:
                print(f"{head} {r['error'][:90]}")
                continue
            g = r.get("ms_graph")
            ratio = f"{base / g:.2f}x" if g and base else "-"
            print(f"{head} {r['ms']:.3f} / {g if g is None else round(g, 3)}  {ratio}  "
                  f"same bits {r.get('same_bits')}")


if __name__ == "__main__":
    if "--cpu-dry-run" in sys.argv:
        bp._dry_run_setup()
        HEADS = {4: (1, 1)}
        main(sys.argv[1], cases=[(2, 1, 192), (4, 1, 192), (2, 2, 128)],
             configs={k: c for k, c in CONFIGS.items() if c.seq_kernel == "triton" and c.bv < 64})
    else:
        main(sys.argv[1])
