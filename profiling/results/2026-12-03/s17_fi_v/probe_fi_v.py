# one-off device probe of the seventeenth stop (run from the project root, FlashInfer staged:
# python3 profiling/results/2026-12-03/s17_fi_v/probe_fi_v.py; --cpu-dry-run: tiny shapes, the
# torch stand-in, the Triton interpreter). The FlashInfer path with the conv writing v straight
# into its workspace (conv_prefill tail_out + gdn_fi_prefill v_in_workspace) against the conv
# writing its own output and the prep copying v, per TP and shape, a state every 256 tokens into
# pool slots: conv + path, FlashInfer's call replayed from fi_capture's graphs (as in vLLM), the
# two compared bit for bit (outputs, state and conv pools); the conv and the prep timed alone
# both ways; the prep's launch knobs (block_t, num_warps); the device's copy bandwidth.
import json, os, sys, time
import torch, triton
sys.path.insert(0, "profiling")
sys.path.insert(0, "tests")
import bench_prefill as bp
from gdn_graphs.ops.conv import conv_prefill
from gdn_graphs.ops.fi_kernels import fi_prep
from gdn_graphs.ops.fi_prefill import FiWorkspace, fi_capture, gdn_fi_prefill, load_fi
from gdn_graphs.runtime.core import _split_qkv

DRY = "--cpu-dry-run" in sys.argv
bp.DEVICE = "cpu" if DRY else "cuda"
torch.set_grad_enabled(False)
OUT = os.environ.get("OUT", "/tmp")
if DRY:
    import fi_standin
    fi_fn = fi_standin.chunk_gated_delta_rule
    SHAPES, TPS = [(2, 256)], (1,)
    bp.K = bp.V = 32
    bp.TP_HEADS = {1: (1, 2)}
else:
    fi_fn, why = load_fi()
    assert fi_fn is not None, why
    SHAPES, TPS = [(1, 8192), (4, 2048), (8, 2048), (4, 16384)], (1, 2)
DEV = bp.DEVICE
K = V = bp.K
EVERY = 256

rows = []
def emit(r):
    rows.append(r)
    print(json.dumps(r), flush=True)

def ms(fn):
    return bp.bench_ms(triton, fn, True)

if not DRY:
    src = torch.empty(1 << 28, dtype=torch.int8, device=DEV)
    dst = torch.empty_like(src)
    copy_tbs = 2 * src.numel() / (ms(lambda: dst.copy_(src)) * 1e-3) / 1e12
    del src, dst
    emit(dict(copy_TBps=copy_tbs))
else:
    copy_tbs = float("nan")

for tp in TPS:
    bp.set_tp(tp)
    for nseq, L in SHAPES:
        case = bp.Case(torch, nseq, L)
        HK, HV, T = case.HK, case.HV, case.T
        C = 2 * HK * K + HV * V
        meta = case.metas["B=256"]
        gen = torch.Generator(device=DEV).manual_seed(1)
        x = torch.randn(T, C, device=DEV, generator=gen, dtype=torch.bfloat16)
        w = (0.5 * torch.randn(C, 4, device=DEV, generator=gen)).to(torch.bfloat16)
        conv0 = torch.zeros(case.pool.shape[0], C, 3, device=DEV, dtype=torch.bfloat16)
        ws = FiWorkspace(T, nseq, HK, HV, K, V, torch.bfloat16, DEV, max_checkpoints=T // 64,
                         fn=fi_fn)
        graphs = fi_capture(ws, EVERY)
        y = torch.empty(T, C, device=DEV, dtype=torch.bfloat16)
        out = torch.empty(T, HV, V, device=DEV, dtype=torch.bfloat16)
        a, b, A_log, dt_bias = case.a, case.b, case.A_log, case.dt_bias
        tail = dict(tail_out=ws.v[:T].view(T, HV * V), tail_from=2 * HK * K)

        def step(v_ws, ssm, conv):
            conv_prefill(x, w, None, conv, meta, out=y, **(tail if v_ws else {}))
            q, k, v = _split_qkv(y, HK, K, HV, V)
            gdn_fi_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta, out, ws, every=EVERY,
                           num_seqs=nseq, v_in_workspace=v_ws)

        r = dict(tp=tp, shape=f"{nseq}x{L}", T=T, graphs=graphs)
        res = {}
        for v_ws in (False, True):
            ssm, conv = torch.zeros_like(case.pool), conv0.clone()
            step(v_ws, ssm, conv)
            res[v_ws] = (out.clone(), ssm.clone(), conv.clone())
            before = dict(ws.calls)
            key = "v_in_ws" if v_ws else "v_copied"
            r[f"{key}_ms"] = ms(lambda: step(v_ws, ssm, conv))
            r[f"{key}_graph_calls"] = ws.calls["graph"] - before["graph"]
            r[f"{key}_eager_calls"] = ws.calls["eager"] - before["eager"]
            r[f"conv_{'tail' if v_ws else 'plain'}_ms"] = ms(
                lambda: conv_prefill(x, w, None, conv, meta, out=y, **(tail if v_ws else {})))
            q, k, v = _split_qkv(y, HK, K, HV, V)
            r[f"prep_{'v_ready' if v_ws else 'v_copy'}_ms"] = ms(
                lambda: fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, nseq, EVERY,
                                interpret=DRY, v_ready=v_ws))
            del ssm, conv
        r["same_bits"] = all(torch.equal(p, q) for p, q in zip(res[False], res[True]))
        # the prep's bytes: q, k, v read and written (v neither when ready), a, b read, alpha and
        # beta written (fp32)
        qk = 2 * T * HK * K * 2
        vb = T * HV * V * 2
        gates = T * HV * (2 * 2 + 2 * 4)
        for name, nbytes in (("v_copy", 2 * qk + 2 * vb + gates), ("v_ready", 2 * qk + gates)):
            r[f"prep_{name}_frac_copy"] = nbytes / (r[f"prep_{name}_ms"] * 1e-3) / 1e12 / copy_tbs
        # the prep's knobs, v ready (what the path now runs in one group)
        sweep = {}
        q, k, v = _split_qkv(y, HK, K, HV, V)
        for bt in (16, 32, 64):
            for nw in (2, 4, 8):
                sweep[f"{bt}/{nw}"] = ms(lambda: fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws,
                                                         meta, nseq, EVERY, interpret=DRY,
                                                         block_t=bt, num_warps=nw, v_ready=True))
        r["prep_sweep_v_ready_ms"] = sweep
        emit(r)
        del case, ws, x, y, out, conv0
        if not DRY:
            torch.cuda.empty_cache()

json.dump(rows, open(os.path.join(OUT, "probe_fi_v.json"), "w"), indent=1)
print(f"\n== conv + FlashInfer path, ms (graph replays), copy {copy_tbs:.3f} TB/s")
print("tp shape       v copied  v in ws  gain   conv plain/tail  prep copy/ready (frac copy)  best knob  same bits")
for r in rows:
    if "shape" not in r:
        continue
    best = min(r["prep_sweep_v_ready_ms"].items(), key=lambda kv: kv[1])
    print(f"{r['tp']}  {r['shape']:>8}  {r['v_copied_ms']:8.3f} {r['v_in_ws_ms']:8.3f}  "
          f"{r['v_copied_ms'] / r['v_in_ws_ms']:.3f}x  {r['conv_plain_ms']:.3f}/{r['conv_tail_ms']:.3f}  "
          f"{r['prep_v_copy_ms']:.3f}/{r['prep_v_ready_ms']:.3f} ({r['prep_v_copy_frac_copy']:.2f}/"
          f"{r['prep_v_ready_frac_copy']:.2f})  {best[0]} {best[1]:.3f}  {r['same_bits']}")
