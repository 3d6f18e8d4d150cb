# one-off device probe of the fourteenth stop (FlashInfer staged; run from the project root):
# where the host time of one FlashInfer chunk_gated_delta_rule call goes (cProfile over 200
# calls at TP 1, 8 x 2048, a state every 256 tokens, the arguments gdn_fi_prefill passes).
import cProfile, io, os, pstats, sys, torch
sys.path.insert(0, "profiling")
import bench_prefill as bp
from gdn_graphs.ops.fi_kernels import fi_prep
from gdn_graphs.ops.fi_prefill import FiWorkspace, load_fi
bp.DEVICE = "cuda"
torch.set_grad_enabled(False)
fi_fn, why = load_fi()
assert fi_fn is not None, why
bp.set_tp(1)
nseq, L = 8, 2048
case = bp.Case(torch, nseq, L)
meta = case.metas["B=256"]
T, every, n_ck = case.T, 256, case.T // 256
ws = FiWorkspace(T, nseq, case.HK, case.HV, 128, 128, torch.bfloat16, "cuda", max_checkpoints=T // 64)
out = torch.empty(T, case.HV, 128, device="cuda", dtype=torch.bfloat16)
q, k, v, a, b, A_log, dt_bias = case.args()[:7]
fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, nseq, every, None, False)
call = lambda: fi_fn(ws.q[:T], ws.k[:T], ws.v[:T], g=ws.alpha[:T], beta=ws.beta[:T], scale=128 ** -0.5,
                     initial_state=ws.h0[:nseq], output_final_state=True, cu_seqlens=ws.cu64[:nseq + 1],
                     output=out, output_state=ws.h0[:nseq], state_checkpoints=ws.ckpt[:n_ck],
                     checkpoint_cu_starts=ws.ckcu[:nseq + 1], checkpoint_every_n_tokens=every, use_cp=False)
for _ in range(5):
    call()
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    call()
pr.disable()
torch.cuda.synchronize()
for key in ("tottime", "cumulative"):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(30)
    text = s.getvalue()
    open(os.path.join(os.environ.get("OUT", "/tmp"), f"fi_host_{key}.txt"), "w").write(text)
    print(text[-6000:] if key == "tottime" else text[:200])
