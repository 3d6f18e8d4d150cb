"""``gdn-graphs``: the demo of prefix caching at every block boundary, and a quick self-check.

    gdn-graphs demo [--json] [--json-out PATH] [--preset tiny|qwen3-next] [--prompt-repeats N]
                    [--modes eager,...] [--block-size B] [--max-tokens T] [--max-new-tokens N]
                    [--dtype float32|bfloat16] [--spec ngram [--num-spec-tokens K]] [--nvtx]
                    [--quiet]
    gdn-graphs verify [--json]
    gdn-graphs profile --out DIR [--nvtx-only] [--preset P] [--layers N] [--mode M] ...

The demo's reference scenario: a prompt made of a ~100-token paragraph repeated many times plus a
tail, generated three times (a warm-up, then two measured runs) with prefix caching on and off, in
every available mode; then a shared system prompt followed by different questions. It prints hits,
time to first token and decode speed, and whether every configuration generated the same tokens.
With ``--spec ngram`` every mode and caching setting also runs with speculative decoding (n-gram
prompt-lookup drafts, k per step): the tokens must be the same as without it, and the table
reports the tokens accepted per spec row and step.

Without a CUDA GPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1 is set here
before anything imports triton), the model is the tiny preset, the prompt is short, and the
CUDA-graph mode is reported as "n/a (no GPU)". Piecewise mode then runs torch.compile (Inductor,
C++ on the CPU, graph partition around the GDN core) without CUDA graphs: its first compile takes
~35 s on a 2-core machine (a few seconds once Inductor's on-disk cache is warm).

Every argument is checked before anything runs: a bad one is a one-line error (exit status 2).
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
        # triton.jit picks the interpreter when a kernel is defined, so kernels imported before
        # this point would run as GPU kernels and fail deep inside Triton: say what to do instead.
        if os.environ.get("TRITON_INTERPRET") != "1" and "gdn_graphs.ops" in sys.modules:
            sys.exit("gdn-graphs: no CUDA GPU, and the kernels were imported before the Triton "
                     "interpreter could be selected; run it as TRITON_INTERPRET=1 gdn-graphs ...")
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


# Defaults of the demo's knobs with and without a GPU (the CPU runs the Triton interpreter: small).
_DEFAULTS = {
    True: dict(preset="qwen3-next", repeats=310, block_size=256, max_tokens=4096,
               max_new_tokens=32, dtype="float32"),
    False: dict(preset="tiny", repeats=3, block_size=64, max_tokens=256, max_new_tokens=6,
                dtype="float32"),
}


def _default(key: str) -> str:
    """The help text's default of one demo setting."""
    gpu, cpu = _DEFAULTS[True][key], _DEFAULTS[False][key]
    return f"default: {gpu}" if gpu == cpu else f"default: {gpu} on a GPU, {cpu} on CPU"


def _demo_settings(args, has_gpu: bool) -> dict:
    """The demo's settings: the arguments given, the machine's defaults for the others (only
    an argument not given takes its default; the parser has refused 0 and negatives)."""
    import torch

    given = dict(preset=args.preset, repeats=args.prompt_repeats, block_size=args.block_size,
                 max_tokens=args.max_tokens, max_new_tokens=args.max_new_tokens, dtype=args.dtype)
    s = dict(_DEFAULTS[has_gpu])
    s.update({k: v for k, v in given.items() if v is not None})
    s["dtype"] = {"float32": torch.float32, "bfloat16": torch.bfloat16}[s["dtype"]]
    return s


def _row(mode, caching, scenario, run, req, spec=None) -> dict:
    m = req.metrics
    return dict(mode=mode, caching="on" if caching else "off", scenario=scenario, run=run,
                spec=spec or "off", queried=m.queried_tokens, hit=m.hit_tokens,
                ttft_ms=m.ttft_s * 1e3, decode_tok_s=m.decode_tok_s, tokens=list(req.output))


def _run_config(eng, spec, prompt, system, questions, max_new, rows, log):
    """The demo's scenarios on one engine: the long prompt three times, then the system prompt
    with each question; appends a row per request to ``rows``. Returns the engine's speculation
    statistics (with its mode and caching), or None without speculation."""
    mode, caching = eng.cfg.mode, eng.cfg.enable_prefix_caching
    for run in ("warm-up", "1", "2"):
        req = eng.generate([prompt], max_new)[0]
        rows.append(_row(mode, caching, "long prompt", run, req, spec))
        log(f"  run {run}: hit {req.metrics.hit_tokens}/{req.metrics.queried_tokens} "
            f"TTFT {req.metrics.ttft_s * 1e3:.0f} ms")
    for i, q in enumerate(questions):
        req = eng.generate([system + q], max_new)[0]
        rows.append(_row(mode, caching, "system prompt", f"q{i}", req, spec))
    if not spec:
        return None
    st = dict(mode=mode, caching="on" if caching else "off", **eng.spec_stats.as_dict())
    log(f"  speculation: {st['tokens_per_row']:.2f} tokens accepted per spec row and step "
        f"({100 * st['draft_acceptance']:.0f}% of drafts)")
    return st


def run_demo(args) -> dict:
    has_gpu = _setup_env()
    import torch

    from gdn_graphs import nvtx
    from gdn_graphs.engine import MODES, Engine, EngineConfig, mode_available
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

    modes = args.modes or list(MODES)  # the parser checked the modes given
    k = args.num_spec_tokens if args.spec else 0
    specs = [None] + ([f"{args.spec} k={k}"] if args.spec else [])
    status, rows, spec_stats = {}, [], []
    for mode in modes:
        ok, why = mode_available(mode, device)
        if not ok:
            status[mode] = why
            log(f"[demo] {mode}: {why}")
            continue
        status[mode] = "ok"
        for spec in specs:
            for caching in (True, False):
                log(f"[demo] {mode}, prefix caching {'on' if caching else 'off'}, "
                    f"speculation {spec or 'off'} ...")
                cfg_kw = dict(mode=mode, enable_prefix_caching=caching, block_size=B,
                              num_slots=num_slots + (4 * (k + 2) if spec else 0), max_seqs=4,
                              max_tokens=s["max_tokens"], max_model_len=blocks * B,
                              decode_buckets=(1, 2, 4), progress=not args.quiet,
                              spec=args.spec if spec else None, num_spec_tokens=k or 3)
                st = _run_config(Engine(model, EngineConfig(**cfg_kw)), spec, prompt, system,
                                 questions, s["max_new_tokens"], rows, log)
                if st is not None:
                    spec_stats.append(st)
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

    warm, cold = measured("on"), measured("off")  # (speculation off and on alike)
    return dict(device=str(torch.cuda.get_device_name() if has_gpu else "cpu (Triton interpreter)"),
                preset=s["preset"], dtype=str(s["dtype"]).split(".")[-1],
                block_size=B, max_tokens=s["max_tokens"], prompt_tokens=len(prompt),
                system_prompt_tokens=len(system), max_new_tokens=s["max_new_tokens"],
                modes=status, rows=rows, identical=identical, spec=spec_stats,
                warm_over_cold_ttft=(warm / cold if cold == cold and cold > 0 else None),
                wall_s=time.perf_counter() - t0)


def _print_table(res: dict) -> None:
    print(f"gdn-graphs demo on {res['device']}: preset {res['preset']} ({res['dtype']}), "
          f"block {res['block_size']}, step budget {res['max_tokens']} tokens")
    print(f"long prompt: {res['prompt_tokens']} tokens; system prompt: "
          f"{res['system_prompt_tokens']} tokens (+ a question); {res['max_new_tokens']} new tokens")
    hdr = f"{'mode':<10} {'caching':<8} {'spec':<10} {'scenario':<14} {'run':<8} {'queried':>8} " \
          f"{'hit':>8} {'TTFT ms':>10} {'decode tok/s':>13}"
    print(hdr)
    print("-" * len(hdr))
    for r in res["rows"]:
        print(f"{r['mode']:<10} {r['caching']:<8} {r['spec']:<10} {r['scenario']:<14} "
              f"{r['run']:<8} {r['queried']:>8} {r['hit']:>8} {r['ttft_ms']:>10.1f} "
              f"{r['decode_tok_s']:>13.1f}")
    for mode, st in res["modes"].items():
        if st != "ok":
            print(f"{mode:<10} {st}")
    for st in res["spec"]:
        steps = " ".join(f"{x:.2f}" for x in st["accepted_per_step"][:24])
        print(f"speculation ({st['mode']}, caching {st['caching']}, k={st['k']}): "
              f"{st['tokens_per_row']:.2f} tokens accepted per spec row and step "
              f"({100 * st['draft_acceptance']:.0f}% of drafts); per step: {steps}"
              f"{' ...' if len(st['accepted_per_step']) > 24 else ''}")
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

class _Parser(argparse.ArgumentParser):
    """An argument error is one line on stderr (exit status 2), not the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_arg(low: int = 1, multiple: int = 1):
    """An argparse ``type``: an integer >= ``low`` and a multiple of ``multiple``."""
    what = f"a multiple of {multiple} >= {max(low, multiple)}" if multiple > 1 else \
        f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < low or v % multiple:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


def _check_modes(demo: argparse.ArgumentParser, text: str, has_gpu: bool) -> list[str]:
    """The modes of ``--modes`` (comma-separated), or a one-line error for an unknown mode or for
    full without a GPU. Called after _setup_env: the engine module imports triton."""
    from gdn_graphs.engine.request import MODES

    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not modes or any(m not in MODES for m in modes):
        demo.error(f"argument --modes: expected a comma-separated subset of {','.join(MODES)}, "
                   f"got {text!r}")
    if "full" in modes and not has_gpu:
        demo.error("argument --modes: full needs a CUDA GPU and none is available")
    return modes


def _out_path(text: str) -> str:
    """An argparse ``type``: a file path whose folder exists (checked before a long demo runs)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not text or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no folder {folder!r} to write {text!r} into")
    return text


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line, and its demo subcommand (for errors found after parsing)."""
    from gdn_graphs.constants import CHUNK

    p = _Parser(prog="gdn-graphs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="prefix caching demo: hits, TTFT, decode speed, identical tokens")
    d.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    d.add_argument("--json-out", type=_out_path, default=None, metavar="PATH",
                   help="also write the JSON to PATH")
    d.add_argument("--preset", choices=["tiny", "qwen3-next"], default=None,
                   help=f"model preset ({_default('preset')})")
    d.add_argument("--prompt-repeats", type=_int_arg(1), default=None, metavar="N",
                   help=f"repeats of the ~100-token paragraph ({_default('repeats')})")
    d.add_argument("--modes", default=None,
                   help="comma-separated subset of eager,piecewise,full (full needs a CUDA GPU; "
                        "default: every mode, those unavailable reported as such)")
    d.add_argument("--block-size", type=_int_arg(CHUNK, CHUNK), default=None, metavar="B",
                   help=f"prefix-cache block, a multiple of {CHUNK} ({_default('block_size')})")
    d.add_argument("--max-tokens", type=_int_arg(CHUNK, CHUNK), default=None, metavar="T",
                   help=f"token budget per step, a multiple of {CHUNK} ({_default('max_tokens')})")
    d.add_argument("--max-new-tokens", type=_int_arg(1), default=None, metavar="N",
                   help=f"tokens generated per request ({_default('max_new_tokens')})")
    d.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help=f"model dtype ({_default('dtype')})")
    d.add_argument("--spec", choices=["ngram"], default=None,
                   help="also run every configuration with speculative decoding (ngram: prompt "
                        "lookup drafts); tokens must not change")
    d.add_argument("--num-spec-tokens", type=_int_arg(1), default=3, metavar="K",
                   help="drafts per decoding request and step with --spec (default: 3)")
    d.add_argument("--nvtx", action="store_true", help="emit NVTX ranges (for nsys)")
    d.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    v = sub.add_parser("verify", help="quick kernels-vs-reference self-check")
    v.add_argument("--json", action="store_true")
    from gdn_graphs.engine import profile

    pr = sub.add_parser("profile", help="where a step's time goes: trace, tables, plots (NVTX "
                                        "ranges under torch.profiler, or for Nsight)")
    profile.add_arguments(pr, _int_arg(1), _int_arg(CHUNK, CHUNK))
    return p, d


def main(argv=None) -> int:
    p, d = _parser()
    args = p.parse_args(argv)
    has_gpu = _setup_env()
    if args.cmd == "profile":
        from gdn_graphs.engine.profile import run_profile

        if args.mode == "full" and not has_gpu:
            p.exit(2, "gdn-graphs profile: error: argument --mode: full needs a CUDA GPU and none "
                      "is available\n")
        run_profile(args)
        return 0
    if args.cmd == "demo":
        if args.modes is not None:
            args.modes = _check_modes(d, args.modes, has_gpu)
        if args.spec:
            B = args.block_size or _DEFAULTS[has_gpu]["block_size"]
            T = args.max_tokens or _DEFAULTS[has_gpu]["max_tokens"]
            if args.num_spec_tokens >= B or 4 * (args.num_spec_tokens + 1) > T:
                d.error(f"argument --num-spec-tokens: {args.num_spec_tokens} must be below the "
                        f"block size ({B}) and 4 rows of 1 + K tokens must fit --max-tokens ({T})")
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
