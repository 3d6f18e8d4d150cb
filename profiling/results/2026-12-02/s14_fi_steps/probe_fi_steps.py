# one-off device probe of the fourteenth stop (run from the project root, FlashInfer staged:
# python3 profiling/results/2026-12-02/s14_fi_steps/probe_fi_steps.py): where the FlashInfer
# path's (gdn_fi_prefill) time goes. Per shape and TP, a state every 256 tokens into pool slots:
# each of its four steps timed alone on the GPU (do_bench), the whole call eager, the host time a
# call takes to issue (50 calls without a sync), and the whole call captured once in a CUDA graph
# and replayed. Also the intra kernel with its inverse sweeps on bf16 operands (timing, and the
# prefill's outputs against the default's).
import importlib.util, json, os, sys, tempfile, time, torch, triton
sys.path.insert(0, "profiling")
import bench_prefill as bp
from gdn_graphs.ops import chunk as C
from gdn_graphs.ops.chunk import gdn_chunk_prefill
from gdn_graphs.ops.fi_kernels import fi_gather, fi_prep, fi_scatter
from gdn_graphs.ops.fi_prefill import FiWorkspace, gdn_fi_prefill, load_fi
bp.DEVICE = "cuda"
torch.set_grad_enabled(False)
OUT = os.environ.get("OUT", "/tmp")
fi_fn, why = load_fi()
assert fi_fn is not None, why

src = open(C.__file__).read()
subs = [("b_N = dot_like_gpu(b_D, tl.where((r // 16) > (c // 16), b_A, 0.), None, INV_PREC, INTERPRET)",
         "b_N = dot_like_gpu(b_D.to(tl.bfloat16), tl.where((r // 16) > (c // 16), b_A, 0.).to(tl.bfloat16), None, INV_PREC, INTERPRET)"),
        ("b_T = b_D - dot_like_gpu(b_N, b_T, None, INV_PREC, INTERPRET)",
         "b_T = b_D - dot_like_gpu(b_N.to(tl.bfloat16), b_T.to(tl.bfloat16), None, INV_PREC, INTERPRET)")]
for a, b in subs:
    assert src.count(a) == 1, a
    src = src.replace(a, b)
path = os.path.join(tempfile.mkdtemp(), "chunk_bf16sweeps.py")
open(path, "w").write(src)
spec = importlib.util.spec_from_file_location("chunk_bf16sweeps", path)
CB = importlib.util.module_from_spec(spec)
spec.loader.exec_module(CB)

rows = []
def emit(r):
    rows.append(r)
    print(json.dumps(r), flush=True)

def host_ms(fn, n=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t_issue = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return t_issue

for tp in (1, 2):
    bp.set_tp(tp)
    for nseq, L in [(1, 8192), (8, 2048), (4, 16384)]:
        case = bp.Case(torch, nseq, L)
        name = "B=256"
        meta = case.metas[name]
        T, shape = case.T, f"{nseq}x{L}"
        ws = FiWorkspace(T, nseq, case.HK, case.HV, 128, 128, torch.bfloat16, "cuda", max_checkpoints=T // 64)
        out = torch.empty(T, case.HV, 128, device="cuda", dtype=torch.bfloat16)
        pool = torch.zeros_like(case.pool)
        every, n_ck = 256, T // 256
        q, k, v, a, b, A_log, dt_bias = case.args()[:7]
        steps = dict(
            prep=lambda: fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, nseq, every, None, False),
            gather=lambda: fi_gather(pool, ws, meta, nseq, None),
            flashinfer=lambda: fi_fn(ws.q[:T], ws.k[:T], ws.v[:T], g=ws.alpha[:T], beta=ws.beta[:T], scale=128 ** -0.5,
                                     initial_state=ws.h0[:nseq], output_final_state=True, cu_seqlens=ws.cu64[:nseq + 1],
                                     output=out, output_state=ws.h0[:nseq], state_checkpoints=ws.ckpt[:n_ck],
                                     checkpoint_cu_starts=ws.ckcu[:nseq + 1], checkpoint_every_n_tokens=every,
                                     use_cp=False),
            scatter=lambda: fi_scatter(pool, ws, meta, nseq, n_ck, every, None))
        whole = lambda: gdn_fi_prefill(q, k, v, a, b, A_log, dt_bias, pool, meta, out, ws, fi_fn=fi_fn, every=every)
        whole()
        r = dict(tp=tp, shape=shape)
        for s, fn in steps.items():
            r[s + "_ms"] = bp.bench_ms(triton, fn, True)
            r[s + "_host_ms"] = host_ms(fn)
        r["whole_ms"] = bp.bench_ms(triton, whole, True)
        r["whole_host_ms"] = host_ms(whole)
        ours = lambda: gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws)
        r["ours_ms"] = bp.bench_ms(triton, ours, True)
        r["ours_host_ms"] = host_ms(ours)
        try:
            ref_out = out.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                whole()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                whole()
            g.replay(); torch.cuda.synchronize()
            r["graph_same_out"] = bool(torch.equal(out, ref_out))
            r["graph_ms"] = bp.bench_ms(triton, g.replay, True)
            del g
        except Exception as e:  # noqa: BLE001
            r["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        # intra with bf16 sweeps: time and outputs against the default
        intra = lambda mod: mod.chunk_intra_fwd(case.q, case.k, case.a, case.b, case.A_log, case.dt_bias, case.out,
                                                 case.ws, meta, 128 ** -0.5, dot_precision="tf32", inv_precision="tf32")
        r["intra_ms"] = bp.bench_ms(triton, lambda: intra(C), True)
        r["intra_bf16sweeps_ms"] = bp.bench_ms(triton, lambda: intra(CB), True)
        ours(); o_ref = case.out.float().clone()
        intra(CB)
        C.chunk_seq_fwd(case.out, case.v, case.pool, case.ws, meta, case.HK, bv=32 if nseq == 1 else 64,
                        num_warps=4, num_stages=3, dot_precision="tf32")
        r["bf16sweeps_rel_diff_out"] = float((case.out.float() - o_ref).norm() / o_ref.norm())
        emit(r)
        del case, ws, out, pool
        torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "probe_fi_steps.json"), "w"), indent=1)
print("\n== summary, ms (GPU time by do_bench; host: issue time per call, 50 calls unsynchronised)")
for r in rows:
    print(f"tp{r['tp']} {r['shape']:>8}: " + "  ".join(
        f"{s} {r[s + '_ms']:.3f}/{r[s + '_host_ms']:.3f}" for s in ("prep", "gather", "flashinfer", "scatter", "whole", "ours"))
          + f"  graph {r.get('graph_ms', float('nan')):.3f} {r.get('graph_error', '')}"
          + f"  intra {r['intra_ms']:.3f} bf16-sweeps {r['intra_bf16sweeps_ms']:.3f} (out diff {r['bf16sweeps_rel_diff_out']:.1e})")
