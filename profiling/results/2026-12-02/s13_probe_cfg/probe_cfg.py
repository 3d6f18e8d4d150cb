# one-off device probe of the thirteenth stop (run from the project root: python3 profiling/results/2026-12-02/s13_probe_cfg/probe_cfg.py): gdn_chunk_prefill per ChunkConfig, shape and TP
import json, os, sys, torch, triton
sys.path.insert(0, "profiling")
import bench_prefill as bp
from gdn_graphs.ops.chunk import ChunkConfig, gdn_chunk_prefill
bp.DEVICE = "cuda"
torch.set_grad_enabled(False)
cfgs = [(32, 4, 3), (64, 4, 3), (64, 4, 2), (16, 4, 2), (16, 4, 3), (64, 8, 3)]
shapes = [(1, 8192), (2, 4096), (8, 2048), (32, 512), (4, 16384)]
rows = []
for tp in (1, 2):
    bp.HK, bp.HV = bp.TP_HEADS[tp]
    for nseq, L in shapes:
        case = bp.Case(torch, nseq, L)
        meta = case.metas["B=256"]
        ref = None
        for bv, w, st in cfgs:
            cfg = ChunkConfig(bv=bv, warps_seq=w, stages=st)
            f = lambda: gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)
            f(); torch.cuda.synchronize()
            if ref is None:
                ref = case.out.float().clone()
            diff = float((case.out.float() - ref).norm() / ref.norm())
            ms = bp.bench_ms(triton, f, True)
            r = dict(tp=tp, shape=f"{nseq}x{L}", bv=bv, warps=w, stages=st, ms=ms, Mtok_s=case.T / ms / 1e3, diff=diff)
            rows.append(r)
            print(json.dumps(r), flush=True)
        del case
        torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_cfg.json"), "w"), indent=1)
for tp in (1, 2):
    for nseq, L in shapes:
        rs = [r for r in rows if r["tp"] == tp and r["shape"] == f"{nseq}x{L}"]
        print(f"tp{tp} {nseq}x{L}: " + "  ".join(f"{r['bv']}/{r['warps']}/{r['stages']} {r['Mtok_s']:.1f}" for r in rs))
