# one-off device probe of the nineteenth stop (run from the project root, FlashInfer staged:
# python3 profiling/results/2026-12-04/s19_fi_small/probe_fi_small.py; --cpu-dry-run: tiny shapes,
# the torch stand-in, the Triton interpreter). The eighteenth stop timed the conv + FlashInfer
# path once per variant (v copied by the prep / v written by the conv into the workspace) and
# found the second slower at 8,192 tokens although its parts were faster. Here each variant is
# timed REPS times, interleaved (A B A B ...), and the host time of issuing one step (no sync,
# the mean over 50 steps) is measured beside the device time: where issuing takes longer than
# the device runs, a timing measures the host, not the kernels.
import json, os, statistics, sys, time
import torch, triton
sys.path.insert(0, "profiling")
sys.path.insert(0, "tests")
import bench_prefill as bp
from gdn_graphs.ops.conv import conv_prefill
from gdn_graphs.ops.fi_prefill import FiWorkspace, fi_capture, gdn_fi_prefill, load_fi
from gdn_graphs.runtime.core import _split_qkv

DRY = "--cpu-dry-run" in sys.argv
bp.DEVICE = "cpu" if DRY else "cuda"
torch.set_grad_enabled(False)
OUT = os.environ.get("OUT", "/tmp")
REPS = 1 if DRY else 5
if DRY:
    import fi_standin
    fi_fn = fi_standin.chunk_gated_delta_rule
    SHAPES, TPS = [(2, 256)], (1,)
    bp.K = bp.V = 32
    bp.TP_HEADS = {1: (1, 2)}
else:
    fi_fn, why = load_fi()
    assert fi_fn is not None, why
    SHAPES, TPS = [(1, 8192), (4, 2048), (8, 2048)], (1, 2)
DEV = bp.DEVICE
K = V = bp.K
EVERY = 256


def sync():
    if not DRY:
        torch.cuda.synchronize()


def host_us(fn, n=50):
    """Mean host time to issue fn() (no sync inside; the queue drained before and after)."""
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n
    sync()
    return dt * 1e6


rows = []
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
        fi_capture(ws, EVERY)
        y = torch.empty(T, C, device=DEV, dtype=torch.bfloat16)
        out = torch.empty(T, HV, V, device=DEV, dtype=torch.bfloat16)
        tail = dict(tail_out=ws.v[:T].view(T, HV * V), tail_from=2 * HK * K)
        ssm, conv = torch.zeros_like(case.pool), conv0.clone()

        def step(v_ws):
            conv_prefill(x, w, None, conv, meta, out=y, **(tail if v_ws else {}))
            q, k, v = _split_qkv(y, HK, K, HV, V)
            gdn_fi_prefill(q, k, v, case.a, case.b, case.A_log, case.dt_bias, ssm, meta, out, ws,
                           every=EVERY, num_seqs=nseq, v_in_workspace=v_ws)

        r = dict(tp=tp, shape=f"{nseq}x{L}", T=T, device_ms={0: [], 1: []}, host_us={0: [], 1: []})
        for v_ws in (0, 1):
            step(v_ws)  # compile and capture outside the timings
        for _ in range(REPS):
            for v_ws in (0, 1):
                r["device_ms"][v_ws].append(bp.bench_ms(triton, lambda: step(v_ws), True))
                r["host_us"][v_ws].append(host_us(lambda: step(v_ws)))
        for v_ws in (0, 1):
            r[f"median_ms_{v_ws}"] = statistics.median(r["device_ms"][v_ws])
            r[f"median_host_us_{v_ws}"] = statistics.median(r["host_us"][v_ws])
        rows.append(r)
        print(json.dumps(r), flush=True)
        del case, ws, x, y, out, conv0, ssm, conv
        if not DRY:
            torch.cuda.empty_cache()

json.dump(rows, open(os.path.join(OUT, "probe_fi_small.json"), "w"), indent=1)
print(f"\n== conv + FlashInfer path, v copied (0) / v in the workspace (1), {REPS} interleaved "
      f"timings each: median ms [min, max], host us to issue one step")
for r in rows:
    d, h = r["device_ms"], r["host_us"]
    print(f"TP {r['tp']} {r['shape']:>8}: " + "  ".join(
        f"{v}: {statistics.median(d[v]):.3f} [{min(d[v]):.3f}, {max(d[v]):.3f}] ms, host "
        f"{statistics.median(h[v]):.0f} us" for v in (0, 1)))
