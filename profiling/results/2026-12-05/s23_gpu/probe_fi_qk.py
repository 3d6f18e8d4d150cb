# One-off device probe of the twenty-third stop (run from the project root with qk.patch applied
# and FlashInfer staged; --cpu-dry-run: tiny shapes, the torch stand-in, the interpreter).
# A prefill step as run_gdn_core issues it (conv, then the GDN prefill), a state every 256 tokens
# into pool slots, bf16 inputs, fp32 pool, ms (triton do_bench median; REPS timings each,
# interleaved):
#   fi_v:  the FlashInfer path as on main (the conv writes v into the workspace, the prep
#          normalises q and k and copies them there)
#   fi_qk: qk.patch (the conv normalises q and k and writes q, k and v into the workspace; the
#          prep makes only the gates)
#   ours:  the conv, then our Triton chunk prefill (chunk_config's knobs)
# and beside them, what vLLM's default runs on Hopper: FlashInfer's kernel alone (q and k
# normalised and the gates made outside the timing; use_cp "auto", and its own checkpoints every
# 256 tokens into a side tensor). Prints a table last; writes $OUT/probe_fi_qk.json.
import json, os, statistics, sys
import torch, triton
sys.path.insert(0, "profiling")
sys.path.insert(0, "tests")
import bench_prefill as bp
from gdn_graphs.ops.chunk import gdn_chunk_prefill
from gdn_graphs.ops.conv import conv_prefill
from gdn_graphs.ops.fi_prefill import FiWorkspace, fi_capture, gdn_fi_prefill, load_fi
from gdn_graphs.ops.workspace import chunk_config
from gdn_graphs.runtime.core import _split_qkv

DRY = "--cpu-dry-run" in sys.argv
bp.DEVICE = "cpu" if DRY else "cuda"
torch.set_grad_enabled(False)
OUT = os.environ.get("OUT", "/tmp")
REPS = 1 if DRY else int(os.environ.get("PROBE_REPS", 3))
if DRY:
    import fi_standin
    fi_fn = fi_standin.chunk_gated_delta_rule
    SHAPES, TPS = [(2, 256)], (1,)
    bp.K = bp.V = 32
    bp.TP_HEADS = {1: (1, 2)}
else:
    fi_fn, why = load_fi()
    assert fi_fn is not None, why
    SHAPES = [(1, 8192), (8, 2048), (4, 16384)]
    TPS = tuple(int(t) for t in os.environ.get("PROBE_TPS", "1,2").split(","))
DEV = bp.DEVICE
K = V = bp.K
EVERY = 256
VARIANTS = ("fi_v", "fi_qk", "ours")

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
        conv = torch.zeros(case.pool.shape[0], C, 3, device=DEV, dtype=torch.bfloat16)
        ws = FiWorkspace(T, nseq, HK, HV, K, V, torch.bfloat16, DEV, max_checkpoints=T // 64,
                         fn=fi_fn)
        fi_capture(ws, EVERY)
        y = torch.empty(T, C, device=DEV, dtype=torch.bfloat16)
        out = torch.empty(T, HV, V, device=DEV, dtype=torch.bfloat16)
        v_tail = dict(tail_out=ws.v[:T].view(T, HV * V), tail_from=2 * HK * K)
        qk_kw = dict(v_tail, l2norm=(2 * HK * K, K),
                     head_out=(ws.q[:T].view(T, HK * K), ws.k[:T].view(T, HK * K)))
        ssm = torch.zeros_like(case.pool)
        cfg = chunk_config(nseq, torch.bfloat16)

        def step(variant):
            kw = {"fi_v": v_tail, "fi_qk": qk_kw, "ours": {}}[variant]
            conv_prefill(x, w, None, conv, meta, out=y, **kw)
            q, k, v = _split_qkv(y, HK, K, HV, V)
            if variant == "ours":
                gdn_chunk_prefill(q, k, v, case.a, case.b, case.A_log, case.dt_bias, ssm, meta,
                                  out=out, workspace=case.ws, config=cfg)
            else:
                gdn_fi_prefill(q, k, v, case.a, case.b, case.A_log, case.dt_bias, ssm, meta, out,
                               ws, every=EVERY, num_seqs=nseq, v_in_workspace=True,
                               qk_in_workspace=variant == "fi_qk")

        res = {}
        for vnt in ("fi_v", "fi_qk"):  # the two FlashInfer variants give the same bits
            ssm.zero_()
            conv.zero_()
            step(vnt)
            res[vnt] = (out.clone(), ssm.clone())
        same = bool(torch.equal(res["fi_v"][0], res["fi_qk"][0])
                    and torch.equal(res["fi_v"][1], res["fi_qk"][1]))
        del res
        step("ours")
        r = dict(tp=tp, shape=f"{nseq}x{L}", T=T, fi_v_equals_fi_qk=same,
                 ms={v: [] for v in VARIANTS})
        for _ in range(REPS):
            for vnt in VARIANTS:
                r["ms"][vnt].append(bp.bench_ms(triton, lambda: step(vnt), True))
        r["median_ms"] = {v: statistics.median(r["ms"][v]) for v in VARIANTS}
        if not DRY:  # FlashInfer's kernel alone, as bench_prefill times it
            fx = bp.FiInputs(torch, case)
            fi = dict(prefill=fi_fn, has_use_cp=True)
            r["fi_alone_ms"] = {"off": bp.bench_ms(triton, lambda: bp.fi_call(fi, fx), True),
                                "ckpt256": bp.bench_ms(triton, lambda: bp.fi_call(fi, fx, "B=256",
                                                                                 use_cp=False), True)}
            del fx
        rows.append(r)
        print(json.dumps(r), flush=True)
        del case, ws, x, y, out, conv, ssm
        if not DRY:
            torch.cuda.empty_cache()

json.dump(dict(device="cpu" if DRY else torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(OUT, "probe_fi_qk.json"), "w"), indent=1)
print(f"\n== conv + prefill step, a state every 256 into the pool, ms (median of {REPS}); "
      "FlashInfer's kernel alone (no states / its own checkpoints every 256) beside")
for r in rows:
    m, f = r["median_ms"], r.get("fi_alone_ms", {})
    fa = f" | FI alone {f['off']:.3f} / {f['ckpt256']:.3f}" if f else ""
    print(f"TP {r['tp']} {r['shape']:>8}: fi_v {m['fi_v']:.3f}  fi_qk {m['fi_qk']:.3f} "
          f"({m['fi_v'] / m['fi_qk']:.2f}x)  ours {m['ours']:.3f}{fa}  same bits: {r['fi_v_equals_fi_qk']}")
