"""``gdn-graphs``: the demo of prefix caching at every block boundary, and a quick self-check.

    gdn-graphs demo [--json] [--preset tiny|qwen3-next] [--prompt-repeats N] [--modes eager,...]
    gdn-graphs verify

The demo's reference scenario: a prompt made of a ~100-token paragraph repeated many times plus a
tail, generated three times (a warm-up, then two measured runs) with prefix caching on and off, in
every available mode; then a shared system prompt followed by different questions. It prints hits,
time to first token and decode speed, and whether every configuration generated the same tokens.

Without a CUDA GPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1 is set here
before anything imports triton), the model is the tiny preset, the prompt is short, and the
CUDA-graph mode is reported as "n/a (no GPU)". Piecewise mode then runs torch.compile (Inductor,
C++ on the CPU, graph partition around the GDN core) without CUDA graphs: its first compile takes
~35 s on a 2-core machine (a few seconds once Inductor's on-disk cache is warm).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def _setup_env() -> bool:
    """Return whether a CUDA GPU is present; without one, select the Triton interpreter before
    triton is imported by anything."""
    import torch

    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import triton

        if triton.__version__.startswith("3.9"):
            # seen: its interpreter types `mask & (scalar >= 0)` as int32 and rejects the load
            sys.exit(f"gdn-graphs: Triton {triton.__version__}'s interpreter cannot run these kernels on "
                     f"a CPU; install triton 3.6 to 3.8 (pip install 'triton>=3.6,<3.9')")
    return has_gpu


# ---------------------------------------------------------------------------------------- demo

def _paragraph(vocab: int, n: int = 100, seed: int = 1234) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def _demo_settings(args, has_gpu: bool) -> dict:
    import torch

    preset_name = args.preset or ("qwen3-next" if has_gpu else "tiny")
    if has_gpu:
        repeats = 310 if args.prompt_repeats is None else args.prompt_repeats
        block = args.block_size or 256
        budget = args.max_tokens or 4096
        new = args.max_new_tokens or 32
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype or "float32"]
    else:
        repeats = 3 if args.prompt_repeats is None else args.prompt_repeats
        block = args.block_size or 64
        budget = args.max_tokens or 256
        new = args.max_new_tokens or 6
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype or "float32"]
    return dict(preset=preset_name, repeats=repeats, block_size=block, max_tokens=budget,
                max_new_tokens=new, dtype=dtype)


def _row(mode, caching, scenario, run, req) -> dict:
    m = req.metrics
    return dict(mode=mode, caching="on" if caching else "off", scenario=scenario, run=run,
                queried=m.queried_tokens, hit=m.hit_tokens, ttft_ms=m.ttft_s * 1e3,
                decode_tok_s=m.decode_tok_s, tokens=list(req.output))


def run_demo(args) -> dict:
    has_gpu = _setup_env()
    import torch

    from gdn_graphs import nvtx
    from gdn_graphs.engine.engine import MODES, Engine, EngineConfig, mode_available
    from gdn_graphs.engine.model import HybridGDNModel, preset

    if args.nvtx:
        nvtx.enable(True)
    s = _demo_settings(args, has_gpu)
    device = torch.device("cuda" if has_gpu else "cpu")
    cfg = preset(s["preset"], dtype=s["dtype"])
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.quiet else (lambda *a: None)
    log(f"[demo] device={device} preset={s['preset']} dtype={str(s['dtype']).split('.')[-1]} "
        f"block={s['block_size']} budget={s['max_tokens']}")
    t0 = time.perf_counter()
    model = HybridGDNModel(cfg, device=device)

    para = _paragraph(cfg.vocab_size)
    rng = random.Random(99)
    tail = [rng.randrange(1, cfg.vocab_size) for _ in range(37)]
    prompt = para * s["repeats"] + tail
    system = _paragraph(cfg.vocab_size, n=2 * s["block_size"] + 45, seed=7)
    questions = [[rng.randrange(1, cfg.vocab_size) for _ in range(15 + 11 * i)] for i in range(3)]
    B = s["block_size"]
    max_len = len(prompt) + s["max_new_tokens"] + B
    max_len = max(max_len, len(system) + 60 + s["max_new_tokens"])
    blocks = -(-max_len // B)
    num_slots = 2 * blocks + 8
    log(f"[demo] prompt {len(prompt)} tokens ({s['repeats']} x {len(para)} + {len(tail)}), "
        f"{num_slots} state slots x {model.pool_bytes_per_slot() / 2**20:.1f} MiB")

    modes = [m.strip() for m in (args.modes or ",".join(MODES)).split(",") if m.strip()]
    status, rows = {}, []
    for mode in modes:
        ok, why = mode_available(mode, device)
        if not ok:
            status[mode] = why
            log(f"[demo] {mode}: {why}")
            continue
        status[mode] = "ok"
        for caching in (True, False):
            log(f"[demo] {mode}, prefix caching {'on' if caching else 'off'} ...")
            eng = Engine(model, EngineConfig(
                mode=mode, enable_prefix_caching=caching, block_size=B, num_slots=num_slots,
                max_seqs=4, max_tokens=s["max_tokens"], max_model_len=blocks * B,
                decode_buckets=(1, 2, 4), progress=not args.quiet))
            for run in ("warm-up", "1", "2"):
                req = eng.generate([prompt], s["max_new_tokens"])[0]
                rows.append(_row(mode, caching, "long prompt", run, req))
                log(f"  run {run}: hit {req.metrics.hit_tokens}/{req.metrics.queried_tokens} "
                    f"TTFT {req.metrics.ttft_s * 1e3:.0f} ms")
            for i, q in enumerate(questions):
                req = eng.generate([system + q], s["max_new_tokens"])[0]
                rows.append(_row(mode, caching, "system prompt", f"q{i}", req))
    # identical tokens: the long prompt over every config and run; each question over configs
    groups: dict[tuple, set] = {}
    for r in rows:
        key = (r["scenario"], r["run"] if r["scenario"] == "system prompt" else "")
        groups.setdefault(key, set()).add(tuple(r["tokens"]))
    identical = all(len(v) == 1 for v in groups.values()) and bool(rows)

    def measured(caching):
        xs = [r["ttft_ms"] for r in rows if r["scenario"] == "long prompt"
              and r["run"] != "warm-up" and r["caching"] == caching]
        return sum(xs) / len(xs) if xs else float("nan")

    warm, cold = measured("on"), measured("off")
    return dict(device=str(torch.cuda.get_device_name() if has_gpu else "cpu (Triton interpreter)"),
                preset=s["preset"], dtype=str(s["dtype"]).split(".")[-1],
                block_size=B, max_tokens=s["max_tokens"], prompt_tokens=len(prompt),
                system_prompt_tokens=len(system), max_new_tokens=s["max_new_tokens"],
                modes=status, rows=rows, identical=identical,
                warm_over_cold_ttft=(warm / cold if cold == cold and cold > 0 else None),
                wall_s=time.perf_counter() - t0)


def _print_table(res: dict) -> None:
    print(f"gdn-graphs demo on {res['device']}: preset {res['preset']} ({res['dtype']}), "
          f"block {res['block_size']}, step budget {res['max_tokens']} tokens")
    print(f"long prompt: {res['prompt_tokens']} tokens; system prompt: "
          f"{res['system_prompt_tokens']} tokens (+ a question); {res['max_new_tokens']} new tokens")
    hdr = f"{'mode':<10} {'caching':<8} {'scenario':<14} {'run':<8} {'queried':>8} {'hit':>8} " \
          f"{'TTFT ms':>10} {'decode tok/s':>13}"
    print(hdr)
    print("-" * len(hdr))
    for r in res["rows"]:
        print(f"{r['mode']:<10} {r['caching']:<8} {r['scenario']:<14} {r['run']:<8} "
              f"{r['queried']:>8} {r['hit']:>8} {r['ttft_ms']:>10.1f} {r['decode_tok_s']:>13.1f}")
    for mode, st in res["modes"].items():
        if st != "ok":
            print(f"{mode:<10} {st}")
    print("-" * len(hdr))
    print(f"generated tokens identical across all configurations: "
          f"{'yes' if res['identical'] else 'NO'}")
    if res["warm_over_cold_ttft"] is not None:
        print(f"warm / cold time to first token (measured runs, mean): "
              f"{100 * res['warm_over_cold_ttft']:.1f}%")
    print(f"wall time {res['wall_s']:.1f} s")


# -------------------------------------------------------------------------------------- verify

def run_verify(args) -> dict:
    has_gpu = _setup_env()
    import torch

    from gdn_graphs.ops import reference as ref
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    from gdn_graphs.ops.conv import conv_decode, conv_prefill
    from gdn_graphs.ops.decode import gdn_decode
    from gdn_graphs.ops.meta import chunk_meta

    dev = "cuda" if has_gpu else "cpu"
    g = torch.Generator().manual_seed(0)
    T, HK, HV, K, V, W, S = 130, 2, 4, 32, 32, 4, 6
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).float().to(dev)
    q, k, v, a, b = r(T, HK, K), r(T, HK, K), r(T, HV, V), r(T, HV), r(T, HV)
    A_log, dt = r(HV).abs().log1p(), r(HV)
    C = 2 * HK * K + HV * V
    x, w = r(T, C), r(C, W)
    checks = {}

    def rel(out, want):
        return float((out.double().cpu() - want.cpu()).norm() / want.norm().clamp_min(1e-30))

    # chunk prefill: 130 tokens from a zero state, checkpoint at 64 and 128, final state
    ssm = torch.zeros(S, HV, V, K, device=dev)
    meta = chunk_meta([T], [0], [-1], [2], [[0, 1]], 64, device=dev)
    o = gdn_chunk_prefill(q, k, v, a, b, A_log, dt, ssm, meta)
    o_ref, s_ref, all_ref = ref.gdn_recurrent_ref(q.cpu(), k.cpu(), v.cpu(), a.cpu(), b.cpu(),
                                                  A_log.cpu(), dt.cpu(), return_all_states=True)
    checks["chunk out"] = rel(o, o_ref)
    checks["chunk ckpt@64"] = rel(ssm[0], all_ref[63])
    checks["chunk final"] = rel(ssm[2], s_ref)
    # decode one token continuing from the state after 130 tokens
    q1, k1, v1, a1, b1 = r(1, HK, K), r(1, HK, K), r(1, HV, V), r(1, HV), r(1, HV)
    slots = lambda *xs: torch.tensor(xs, dtype=torch.int32, device=dev)
    od = gdn_decode(q1, k1, v1, a1, b1, A_log, dt, ssm, slots(2), slots(3))
    od_ref, sd_ref = ref.gdn_recurrent_ref(q1.cpu(), k1.cpu(), v1.cpu(), a1.cpu(), b1.cpu(),
                                           A_log.cpu(), dt.cpu(), state=s_ref)
    checks["decode out"] = rel(od, od_ref)
    checks["decode state"] = rel(ssm[3], sd_ref)
    # conv prefill + decode
    conv = torch.zeros(S, C, W - 1, device=dev)
    y = conv_prefill(x, w, None, conv, meta)
    y_ref, win_ref = ref.causal_conv1d_ref(x.cpu(), w.cpu())
    checks["conv prefill"] = rel(y, y_ref)
    checks["conv window"] = rel(conv[2], win_ref)
    x1 = r(1, C)
    y1 = conv_decode(x1, w, None, conv, slots(2), slots(3))
    y1_ref, _ = ref.causal_conv1d_ref(x1.cpu(), w.cpu(), window=win_ref)
    checks["conv decode"] = rel(y1, y1_ref)
    tol = 1e-4
    return dict(device=dev, tolerance=tol, rel_errors=checks,
                ok=all(e < tol for e in checks.values()))


# ---------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gdn-graphs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="prefix caching demo: hits, TTFT, decode speed, identical tokens")
    d.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    d.add_argument("--json-out", default=None, metavar="PATH", help="also write the JSON to PATH")
    d.add_argument("--preset", choices=["tiny", "qwen3-next"], default=None,
                   help="model preset (default: qwen3-next on a GPU, tiny on CPU)")
    d.add_argument("--prompt-repeats", type=int, default=None,
                   help="repeats of the ~100-token paragraph (default: 310 on a GPU, 3 on CPU)")
    d.add_argument("--modes", default=None, help="comma-separated subset of eager,piecewise,full")
    d.add_argument("--block-size", type=int, default=None)
    d.add_argument("--max-tokens", type=int, default=None, help="token budget per step")
    d.add_argument("--max-new-tokens", type=int, default=None)
    d.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    d.add_argument("--nvtx", action="store_true", help="emit NVTX ranges (for nsys)")
    d.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    v = sub.add_parser("verify", help="quick kernels-vs-reference self-check")
    v.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    if args.cmd == "demo":
        res = run_demo(args)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(res, f, indent=1)
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            _print_table(res)
        return 0 if res["identical"] else 1
    res = run_verify(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"gdn-graphs verify on {res['device']} (relative error vs fp64 reference, "
              f"tolerance {res['tolerance']:g}):")
        for name, e in res["rel_errors"].items():
            print(f"  {name:<16} {e:.2e}  {'ok' if e < res['tolerance'] else 'FAIL'}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
