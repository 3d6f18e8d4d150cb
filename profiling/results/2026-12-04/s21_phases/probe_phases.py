"""Probe (twenty-first stop): our chunked prefill with its two kernels overlapped in phases
(ChunkConfig.phases), against one phase, at each V tile and pipelining depth; a state every 256
tokens into pool slots, bf16 inputs, fp32 pool, fresh sequences (bench_prefill's Case).

    python3 profiling/results/2026-12-04/s21_phases/probe_phases.py --out DIR [--tp 1,2]

Every config's outputs and pool are compared bit for bit with (bv 32, 3 stages, one phase).
Beside it in the same run, where FlashInfer imports, what a user gets without gdn_graphs on
Hopper: FlashInfer's chunk_gated_delta_rule alone (bench_prefill's FiInputs: q, k normalised and
the gates made outside the timing) without checkpoints (use_cp "auto", vLLM's pick, and False)
and with its own checkpoints every 256 tokens into a side tensor. Writes DIR/probe_phases.json;
prints a table last: ms per config and phase count, the best phase count against one phase, and
our best against FlashInfer.
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "profiling"))

import torch  # noqa: E402
import triton  # noqa: E402

import bench_prefill as bp  # noqa: E402
from gdn_graphs.ops.chunk import (ChunkConfig, ChunkWorkspace, chunk_intra_fwd, chunk_seq_fwd,  # noqa: E402
                                  gdn_chunk_prefill)

SHAPES = [(1, 2048), (1, 8192), (1, 16384), (2, 4096), (4, 2048), (8, 2048), (4, 16384)]
KNOBS = [(32, 3), (64, 3), (32, 2), (64, 2)]
PHASES = [1, 2, 4, 8]


def ms_of(fn):
    fn()
    if bp.DEVICE == "cpu":  # --cpu-smoke: the bookkeeping only
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def fi_columns(fi, case):
    """FlashInfer's kernel alone on this case: ms of "off" (use_cp auto), "off_nocp" and
    "ckpt256" (its own checkpoints every 256 tokens), each caught on its own."""
    fi = dict(fi, has_use_cp=True)
    x = bp.FiInputs(torch, case)
    res = {}
    for key, fn in (("off", lambda: bp.fi_call(fi, x)),
                    ("off_nocp", lambda: bp.fi_call(fi, x, use_cp=False)),
                    ("ckpt256", lambda: bp.fi_call(fi, x, "B=256", use_cp=False))):
        try:
            res[key] = ms_of(fn)  # (its first call, which compiles, is ms_of's untimed one)
        except Exception as e:  # noqa: BLE001 - e.g. a CuTe-DSL argument error
            res[key + "_error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
    del x
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tp", default="1,2")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny heads and one shape on the CPU")
    args = p.parse_args()
    global SHAPES, KNOBS, PHASES
    if args.cpu_smoke:
        bp.DEVICE, bp.TP_HEADS, bp.K, bp.V = "cpu", {1: (1, 2)}, 16, 16
        SHAPES, KNOBS, PHASES = [(2, 192)], [(32, 3)], [1, 2]
        args.tp = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    fi, fi_why = bp.load_fi() if bp.DEVICE == "cuda" else (None, "not on the CPU")
    rows = []
    for tp in [int(t) for t in args.tp.split(",")]:
        bp.set_tp(tp)
        for nseq, L in SHAPES:
            case = bp.Case(torch, nseq, L)
            meta = case.metas["B=256"]
            ws = ChunkWorkspace(case.T, bp.HV, bp.K, bp.V, torch.bfloat16, bp.DEVICE, HK=bp.HK,
                                carry_seqs=nseq)
            pool0 = case.pool.clone()

            def run(cfg):
                gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=ws, config=cfg)

            case.pool.copy_(pool0)
            run(ChunkConfig())
            ref_out, ref_pool = case.out.clone(), case.pool.clone()
            # the two kernels alone, one phase, default knobs
            intra_ms = ms_of(lambda: chunk_intra_fwd(case.q, case.k, case.a, case.b, case.A_log,
                                                     case.dt_bias, case.out, ws, meta, bp.K ** -0.5,
                                                     dot_precision="tf32", inv_precision="tf32"))
            run(ChunkConfig())
            seq_ms = ms_of(lambda: chunk_seq_fwd(case.out, case.v, case.pool, ws, meta, bp.HK, bv=32,
                                                 num_stages=3, dot_precision="tf32"))
            for bv, st in KNOBS:
                for P in PHASES:
                    cfg = ChunkConfig(bv=bv, stages=st, phases=P)
                    row = dict(tp=tp, shape=f"{nseq}x{L}", T=case.T, bv=bv, stages=st, phases=P)
                    try:
                        case.pool.copy_(pool0)
                        case.out.fill_(float("nan"))
                        run(cfg)
                        row["same_bits"] = bool(torch.equal(case.out, ref_out)
                                                and torch.equal(case.pool, ref_pool))
                        row["ms"] = ms_of(lambda: run(cfg))
                        row["Mtok_s"] = case.T / row["ms"] / 1e3
                    except Exception as e:  # noqa: BLE001 - e.g. shared memory: record, go on
                        row["error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            rows.append(dict(tp=tp, shape=f"{nseq}x{L}", intra_ms=intra_ms, seq_ms=seq_ms,
                             fi=fi_columns(fi, case) if fi else dict(error=fi_why)))
            print(json.dumps(rows[-1]), flush=True)
            del case, ws, pool0, ref_out, ref_pool
            if bp.DEVICE == "cuda":
                torch.cuda.empty_cache()
    (args.out / "probe_phases.json").write_text(json.dumps(dict(
        commit=bp.git_commit(), device=torch.cuda.get_device_name() if bp.DEVICE == "cuda" else "cpu",
        rows=rows), indent=1))
    print("\ntp shape      knobs  " + " ".join(f"P={P:<6}" for P in PHASES)
          + " best/P1  bits  (intra, seq ms; FlashInfer off / off non-cp / ckpt 256 ms; "
          "FI off / our best, FI ckpt 256 / our best)")
    for tp in sorted({r["tp"] for r in rows}):
        for nseq, L in SHAPES:
            sh = f"{nseq}x{L}"
            alone = [r for r in rows if r["tp"] == tp and r["shape"] == sh and "intra_ms" in r]
            for bv, st in KNOBS:
                rs = {r["phases"]: r for r in rows if r.get("tp") == tp and r.get("shape") == sh
                      and r.get("bv") == bv and r.get("stages") == st}
                ms = [rs[P].get("ms") for P in PHASES]
                ok = all(r.get("same_bits") for r in rs.values())
                best = min((m for m in ms if m), default=None)
                ratio = (ms[0] / best) if ms[0] and best else float("nan")
                extra = ""
                if alone and (bv, st) == KNOBS[0]:
                    a, f = alone[0], alone[0]["fi"]
                    ours = min((r["ms"] for r in rows if r.get("tp") == tp and r.get("shape") == sh
                                and "ms" in r), default=None)
                    fis = " / ".join(f"{f[k]:.3f}" if k in f else "err" for k in ("off", "off_nocp", "ckpt256"))
                    rat = (f"; {f['off'] / ours:.2f}x, {f['ckpt256'] / ours:.2f}x"
                           if ours and "off" in f and "ckpt256" in f else "")
                    extra = f"({a['intra_ms']:.3f}, {a['seq_ms']:.3f}; {fis}{rat})"
                print(f"{tp}  {sh:9s} {bv}/{st}  " + " ".join(f"{m:7.3f}" if m else "   err " for m in ms)
                      + f"  {ratio:5.2f}x  {'same' if ok else 'DIFF'}  {extra}")


if __name__ == "__main__":
    main()
