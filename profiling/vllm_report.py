"""Summarise profiling/vllm_e2e.py results: reuse vs expected, token agreement, TTFT, decode speed.

    python profiling/vllm_report.py DIR [--ref NAME] [--json OUT]

Reads DIR/*.json (one per engine configuration; the file stem names it). Token agreement is
checked against --ref (default: the first name in sorted order); where two configurations differ,
the first differing position and the top-2 logprob margin there (in both) are reported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_load  # noqa: E402

CAPACITY = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
# vLLM's capture progress bars, e.g. "Capturing CUDA graphs (decode, FULL)"
CAPTURE = re.compile(r"Capturing CUDA graphs \(([\w -]+), (\w+)\)")
# vLLM's JIT monitor: a kernel compiled while serving ("Triton kernel" or "CuTeDSL"), e.g.
# FlashInfer's GDN prefill in vLLM's own mode, seen inside timed scenarios on 2026-12-01
JIT = re.compile(r"(\d\d:\d\d:\d\d) \[jit_monitor\.py:\d+\] (\w+)(?: kernel)? JIT compilation "
                 r"during inference: (\w+)")


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def our_kernel_names() -> set:
    """The names of gdn_graphs' Triton kernels (what Triton's cache files are named after)."""
    import importlib

    import triton
    names = set()
    for mod in ("gdn_graphs.ops.decode", "gdn_graphs.ops.conv", "gdn_graphs.ops.chunk",
                "gdn_graphs.ops.conv_multi"):
        for attr, obj in vars(importlib.import_module(mod)).items():
            if isinstance(obj, triton.runtime.KernelInterface):
                names.add(attr)
    return names


def check(res: dict, near_ties: list | None = None) -> list:
    """What issue 5's end-to-end runs must show, as a list of failures (empty: all good).

    * an engine with the plugin and prefix caching on runs in mamba cache mode "all", and every
      later request of the repeat / shared / system scenarios (and every warm request of a burst)
      reuses exactly the expected tokens (the shared prefix rounded down to whole blocks);
    * no gdn_graphs kernel was compiled after the engine was up (where recorded);
    * float32 engines generate the same greedy tokens, scenario by scenario, whatever their
      prefix-caching and CUDA-graph settings (bf16 is exempt: near-tied logits flip);
    * in the abort scenario (where run), both aborts happened and the requests that ran on
      generated exactly what each generates alone;
    * with speculative decoding (issue 12): turns 2 and 3 of the chat scenario reuse every whole
      block of the previous prompt and answer (plugin, prefix caching on), vLLM reports drafts,
      and an engine with CUDA graphs on captured FULL decode graphs. Float32 tokens are compared
      with an engine without speculation where there is one. A difference where either engine's
      top-2 logits are within NEAR_TIE goes to ``near_ties`` instead where the caller passes that
      list (reported, not a failure; without the list it is a failure),
      and a chat turn after a differing one is not compared (its prompt holds the other answer).
    """
    problems, fp32, ours = [], {}, our_kernel_names()
    for name, r in sorted(res.items()):
        c, sc = r["config"], r["scenarios"]
        if c.get("plugin") == "on" and c.get("prefix_caching") == "on":
            if r["mamba_cache_mode"] != "all":
                problems.append(f"{name}: mamba cache mode {r['mamba_cache_mode']!r}, not 'all'")
            for key in ("repeat", "shared", "system"):
                if key in sc:
                    got = [x["num_cached_tokens"] for x in sc[key]["runs"][1:]]
                    if any(g != sc[key]["expected_reuse"] for g in got):
                        problems.append(f"{name}: {key} reused {got}, expected "
                                        f"{sc[key]['expected_reuse']} each")
            for shape, e in sc.get("burst", {}).items():
                got = e["warm"]["num_cached_tokens"]
                if any(g != e["expected_warm_reuse"] for g in got):
                    problems.append(f"{name}: burst {shape} warm reused {got}, expected "
                                    f"{e['expected_warm_reuse']} each")
            if "chat" in sc:
                got = [x["num_cached_tokens"] for x in sc["chat"]["runs"]][1:]
                if got != sc["chat"]["expected_reuse_per_turn"][1:]:
                    problems.append(f"{name}: chat turns 2, 3 reused {got}, expected "
                                    f"{sc['chat']['expected_reuse_per_turn'][1:]}")
        problems += spec_problems(name, r)
        ab = sc.get("abort")
        if ab is not None:
            if set(ab["aborted"]) != {"abort_prefill", "abort_decode"}:
                problems.append(f"{name}: abort scenario aborted {sorted(ab['aborted'])}")
            if not ab["survivors_equal"] or set(ab["together"]) != set(ab["alone"]):
                problems.append(f"{name}: abort scenario: the requests that ran on did not "
                                f"generate what they generate alone")
        if c.get("plugin") == "on":
            late = sorted({k for _, k in r.get("triton_compiles_after_start") or [] if k in ours})
            if late:
                problems.append(f"{name}: gdn_graphs kernels compiled after start-up: {late}")
        if c.get("dtype") == "float32":
            runs = {k: v["runs"] for k, v in sc.items() if "runs" in v}
            if "ttft" in sc:
                runs["ttft"] = [sc["ttft"]["cold"], sc["ttft"]["warm"]]
            for n, e in sc.get("ttft_more", {}).items():
                runs[f"ttft_{n}"] = [e["cold"], e["warm"]]
            fp32[name] = {k: [x["tokens"] for x in v] for k, v in runs.items()}
    for name, r in sorted(res.items()):
        problems += vllm_load.check(name, r, r["config"].get("plugin") == "on")
    names = sorted(fp32)
    base = next((n for n in names if res[n]["config"].get("spec", "none") == "none"), None)
    base = base or (names[0] if names else None)
    for n in names:
        for key in sorted(set(fp32[n]) & set(fp32[base])) if n != base else ():
            for i, (x, y) in enumerate(zip(fp32[n][key], fp32[base][key])):
                d = first_diff(x, y)
                if d is None:
                    continue
                m = (_margin(res[n], key, i, d), _margin(res[base], key, i, d))
                line = (f"{n}: float32 tokens of {key!r} run {i} differ from {base} at position "
                        f"{d} (top-2 margin there: {m[0]} / {m[1]})")
                if all(x is not None for x in m) and min(m) < NEAR_TIE:
                    # two logits within NEAR_TIE: a different (equally valid) summation order
                    # picks the other one; reported, not a failure
                    # a caller that keeps no list gets them as failures: never dropped unseen
                    (near_ties if near_ties is not None else problems).append(line)
                else:
                    problems.append(line)
                if key == "chat":
                    break  # a later turn's prompt holds this answer: the prompts differ from here
    return problems


# top-2 logit margins below this are near-ties (float32 logits of the tiny random models are O(1):
# seen 4e-5 / 0.0 where speculative verification and plain decode picked different tokens)
NEAR_TIE = 1e-3


def _margin(r: dict, key: str, run: int, pos: int):
    scs = r["scenarios"]
    sc = scs[key] if key in scs else scs["ttft_more"][key.removeprefix("ttft_")]
    runs = sc["runs"] if "runs" in sc else [sc["cold"], sc["warm"]]
    m = runs[run].get("top2_margins") or []
    return round(m[pos], 5) if pos < len(m) and m[pos] is not None else None


def spec_problems(name: str, r: dict) -> list:
    """Issue 12's checks of one engine with speculative decoding (none for the others)."""
    c = r["config"]
    if c.get("spec", "none") == "none":
        return []
    out = []
    stats = (r.get("spec_stats_after") or {}).get("decode") or {}
    drafts = stats.get("spec_decode_num_drafts")
    if not drafts:
        out.append(f"{name}: vLLM reports no speculative drafts ({stats})")
    if c.get("graphs") == "on" and ("decode", "FULL") not in r.get("captures", ()):
        out.append(f"{name}: no FULL decode CUDA graphs captured (captures: {r.get('captures')})")
    return out


def _read(path: Path) -> str:
    """A result file's text; recorded results are kept gzipped (NAME.json.gz, NAME.log.gz: the
    device's carry limit counts the tracked tree)."""
    gz = path.with_name(path.name + ".gz")
    if not path.exists() and gz.exists():
        return gzip.decompress(gz.read_bytes()).decode(errors="replace")
    return path.read_text(errors="replace") if path.exists() else ""


def load(d) -> dict:
    """DIR/*.json (or .json.gz), each with the capacity its engine logged (DIR/NAME.log or
    .log.gz) where there is one."""
    names = sorted({p.name.removesuffix(".gz").removesuffix(".json")
                    for p in Path(d).glob("*.json*") if p.name.endswith((".json", ".json.gz"))})
    res = {n: json.loads(_read(Path(d) / f"{n}.json")) for n in names if n != "summary"}
    for name, r in res.items():
        text = _read(Path(d) / f"{name}.log")
        r["captures"] = sorted(set(CAPTURE.findall(text)))
        r["jit_during_inference"] = [list(m) for m in JIT.findall(text)]
        m, c = CAPACITY.search(text), CONCURRENCY.search(text)
        if m and c:
            r["capacity"] = {"tokens": int(m.group(1).replace(",", "")),
                             "per_request_tokens": int(c.group(1).replace(",", "")),
                             "concurrency": float(c.group(2))}
    return res


def print_load_and_capacity(res: dict, summary: dict) -> None:
    """The capacity each engine logged and the load scenario's figures, one line each."""
    for name, r in res.items():
        row = summary["configs"][name]
        cap, L = r.get("capacity"), r["scenarios"].get("load")
        if cap:
            row["capacity"] = cap
            print(f"{name}: capacity {cap['tokens']:,} tokens, concurrency {cap['concurrency']}x "
                  f"for {cap['per_request_tokens']:,}; max_model_len {r.get('max_model_len')}")
        if L:
            row["load"] = {k: v for k, v in L.items()}
            g = L.get("gdn_pages") or {}
            print(f"{name}: load {L['finished']}/{L['requests']} done in {L['wall_s']} s, "
                  f"{L['output_tok_per_s']} out tok/s, {L['prompt_tok_per_s']} prompt tok/s, "
                  f"preemptions {L['preemptions']}, TTFT p50/p90/p99 {list(L['ttft_s'].values())} s, "
                  f"TPOT {[round(x, 2) for x in L['tpot_ms'].values()]} ms, reused "
                  f"{L['reused_tokens']} (shared hit {L['shared_hit_fraction']}), GDN pages peak "
                  f"{g.get('peak_held', '-')} evictable {g.get('evictable', '-')} in place "
                  f"{g.get('in_place', '-')}")


def print_spec(res: dict, summary: dict) -> None:
    """Speculative decoding per engine: acceptance (vLLM's counters), chat reuse per turn, the
    CUDA graphs captured."""
    for name, r in res.items():
        spec = r["config"].get("spec", "none")
        chat = r["scenarios"].get("chat")
        row = summary["configs"][name]
        if chat:
            row["chat"] = {"got": [x["num_cached_tokens"] for x in chat["runs"]],
                           "expected": chat["expected_reuse_per_turn"],
                           "prompt_lens": [x["prompt_len"] for x in chat["runs"]]}
        if spec == "none" and not chat:
            continue
        st = (r.get("spec_stats_after") or {}).get("decode") or {}
        drafts, toks = st.get("spec_decode_num_drafts"), st.get("spec_decode_num_draft_tokens")
        acc = st.get("spec_decode_num_accepted_tokens")
        row["spec"] = {"method": spec, "k": r["config"].get("spec_k"), "drafts": drafts,
                       "draft_tokens": toks, "accepted": acc,
                       "accepted_per_pos": st.get("spec_decode_num_accepted_tokens_per_pos"),
                       "acceptance_rate": round(acc / toks, 4) if acc and toks else None,
                       "captures": r.get("captures"),
                       "async_scheduling": r.get("async_scheduling")}
        print(f"{name}: spec {spec} k={r['config'].get('spec_k')}: drafts {drafts}, draft tokens "
              f"{toks}, accepted {acc} (per position {row['spec']['accepted_per_pos']}); chat "
              f"reuse {row.get('chat', {}).get('got')} of {row.get('chat', {}).get('expected')}; "
              f"captures {r.get('captures')}")


# windows (vllm_e2e's scenario_start_s) whose requests are not timed: the warm-ups before a
# scenario's clock starts (NAME, then NAME_timed) and the first use of a TTFT length
UNTIMED = ("start-up", "ttft", "decode", "burst", "load", "end")


def _clock_s(hms: str) -> float:
    h, m, sec = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def jit_window(r: dict, hms: str) -> list[str]:
    """The scenario windows a JIT-monitor line logged at ``hms`` (whole seconds: [hms, hms + 1))
    falls in, from the engine's scenario_start_s and engine_up_clock; [] when the run did not
    record its clock. vLLM 0.26 logs a CuTe-DSL compile as it starts (Triton's after), and each
    kernel name once per process (``warning_once``): a later compile of the same kernel for
    another shape leaves no line."""
    up, marks = r.get("engine_up_clock"), r.get("scenario_start_s") or {}
    if not up:
        return []
    t0 = (_clock_s(hms) - _clock_s(up)) % 86400  # seconds after engine up (past midnight too)
    order = sorted((t, k) for k, t in marks.items())
    first = ([k for m, k in order if m <= t0] or ["start-up"])[-1]
    return [first] + [k for m, k in order if t0 < m < t0 + 1]


def timed(window: str) -> bool:
    return window not in UNTIMED and not window.endswith("_first_use")


def print_jit(res: dict, summary: dict) -> None:
    """Kernels vLLM's JIT monitor saw compile while serving, other than Triton's (those are in
    triton_compiles_after_start, with times), each placed in the scenario window it fell in: a
    timed window that held one is not a clean figure (FlashInfer's CuTe-DSL prefill compiles on
    first use, 8-17 s); an untimed warm-up window is where such a compile belongs."""
    for name, r in res.items():
        other = [(t, kind, k) for t, kind, k in r.get("jit_during_inference", []) if kind != "Triton"]
        summary["configs"][name]["jit_during_inference"] = r.get("jit_during_inference", [])
        if not other:
            continue
        if not r.get("engine_up_clock"):
            print(f"{name}: compiled while serving (not Triton): "
                  + ", ".join(f"{k} ({kind}, {t})" for t, kind, k in other)
                  + ": the scenario running then is not a clean timing")
            continue
        placed = []
        for t, kind, k in other:
            ws = jit_window(r, t)
            placed.append({"at": t, "kind": kind, "kernel": k, "windows": ws,
                           "timed": any(timed(w) for w in ws)})
            verdict = (f"in timed {'/'.join(w for w in ws if timed(w))}: not a clean timing"
                       if placed[-1]["timed"] else "in untimed warm-up " + "/".join(ws))
            print(f"{name}: compiled while serving (not Triton): {k} ({kind}, {t}), {verdict}")
        summary["configs"][name]["jit_placed"] = placed


def read_gpu_monitor(path: Path) -> list[tuple]:
    """vllm_session.sh's nvidia-smi log (timestamp, utilization %, SM MHz, memory MHz, W, C every
    200 ms) as (epoch s, util, sm MHz, W) rows; [] without one. nvidia-smi writes local time,
    read here in this machine's zone: run the report where the log was made, or in its zone."""
    rows = []
    for line in _read(path).splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            t = time.mktime(time.strptime(f[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            rows.append((t + float("0." + f[0].split(".")[1]), float(f[1]), float(f[2]),
                         float(f[4])))
        except (ValueError, IndexError):
            continue  # a header or a cut line
    return rows


def monitor_over(rows: list[tuple], wall) -> dict | None:
    """Mean GPU utilisation, SM clock and power inside one run's wall window (epoch s)."""
    inside = [r for r in rows if wall[0] <= r[0] <= wall[1]]
    if not inside:
        return None
    mean = lambda i: round(sum(r[i] for r in inside) / len(inside), 1)  # noqa: E731
    return {"samples": len(inside), "util_pct": mean(1), "sm_mhz": mean(2), "power_w": mean(3)}


def print_decode_runs(res: dict, summary: dict, monitor: list[tuple] = ()) -> None:
    """Every timed decode run of a configuration (--decode-repeats), where there were several,
    with the GPU's mean utilisation, SM clock and power over each run where a monitor log lies
    beside the results (a GPU-bound decode keeps it busy; a host-bound one leaves it idle)."""
    for name, r in res.items():
        runs = r["scenarios"].get("decode", {}).get("engine_decode_runs", [])
        gpu = [monitor_over(monitor, x["wall"]) if monitor and "wall" in x else None for x in runs]
        if len(runs) > 1 or any(gpu):
            summary["configs"][name]["decode_runs"] = runs
            print(f"{name}: decode runs, engine tok/s {[x['tok_per_s'] for x in runs]}, median "
                  f"TPOT ms {[x['median_tpot_ms'] for x in runs]}")
        if any(gpu):
            summary["configs"][name]["decode_gpu"] = gpu
            print(f"{name}: GPU over each decode run (util %, SM MHz, W): "
                  f"{[(g['util_pct'], g['sm_mhz'], g['power_w']) if g else None for g in gpu]}")


def print_bursts(res: dict, summary: dict) -> None:
    """The burst scenario per configuration: wall time and prefill tokens/s, cold and warm."""
    for name, r in res.items():
        for shape, e in r["scenarios"].get("burst", {}).items():
            c, w = e["cold"], e["warm"]
            walls = e.get("cold_walls_s", [c["wall_s"]])  # (runs before --burst-repeats: one)
            med = e.get("cold_median_wall_s", c["wall_s"])
            summary["configs"][name].setdefault("burst", {})[shape] = {
                "cold_wall_s": c["wall_s"], "cold_walls_s": walls, "cold_median_wall_s": med,
                "cold_prefill_tok_per_s": c["prefill_tok_per_s"], "warm_wall_s": w["wall_s"],
                "warm_cached": w["num_cached_tokens"], "expected_warm_reuse": e["expected_warm_reuse"]}
            print(f"{name}: burst {shape}: cold median {med:.3f} s (all cold bursts {walls}; the "
                  f"one before the warm burst {c['wall_s']:.3f} s, {c['prefill_tok_per_s']:.0f} "
                  f"prefill tok/s, TTFT min/median/max {c['ttft_s_min_median_max']}), warm "
                  f"{w['wall_s']:.3f} s (cached {sorted(set(w['num_cached_tokens']))} of "
                  f"{e['expected_warm_reuse']} expected)")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ref")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless the runs show what issue 5 asks (see check())")
    a = ap.parse_args(argv)
    res = load(a.dir)
    if not res:
        print("no results")
        return 1
    # token agreement only means something within one model dtype: names start with it
    refs = {}
    for name in sorted(res):
        refs.setdefault(name.split("_")[0], a.ref if a.ref in res else name)
    summary = {"refs": refs, "configs": {}}
    print(f"{'config':<22} {'mode':<6} {'B':>4} {'start s':>7}  reuse (got/expected)"
          f"                         ttft cold/warm s  decode tok/s  tokens vs ref")
    for name, r in res.items():
        ref = refs[name.split("_")[0]]
        sc = r["scenarios"]
        row = {"mode": r["mamba_cache_mode"], "block": r["block_size"], "start_s": r["engine_start_s"]}
        reuse = []
        if "repeat" in sc:
            got = [x["num_cached_tokens"] for x in sc["repeat"]["runs"]]
            row["repeat"] = {"got": got, "expected": sc["repeat"]["expected_reuse"]}
            reuse.append(f"rep {got[1]},{got[2]}/{sc['repeat']['expected_reuse']}")
        if "shared" in sc:
            got = sc["shared"]["runs"][1]["num_cached_tokens"]
            row["shared"] = {"got": got, "expected": sc["shared"]["expected_reuse"]}
            reuse.append(f"shr {got}/{sc['shared']['expected_reuse']}")
        if "system" in sc:
            got = [x["num_cached_tokens"] for x in sc["system"]["runs"]]
            row["system"] = {"got": got, "expected": sc["system"]["expected_reuse"]}
            reuse.append(f"sys {got[1]},{got[2]}/{sc['system']['expected_reuse']}")
        ttft = "-"
        if "ttft" in sc:
            c, w = sc["ttft"]["cold"], sc["ttft"]["warm"]
            cv, wv = c["ttft_s"] or c["wall_s"], w["ttft_s"] or w["wall_s"]
            row["ttft"] = {"cold_s": cv, "warm_s": wv, "warm_cached": w["num_cached_tokens"]}
            ttft = f"{cv:.3f}/{wv:.3f}"
            for n, e in sc.get("ttft_more", {}).items():  # further --ttft-len lengths
                c, w = e["cold"], e["warm"]
                cv, wv = c["ttft_s"] or c["wall_s"], w["ttft_s"] or w["wall_s"]
                row[f"ttft_{n}"] = {"cold_s": cv, "warm_s": wv, "warm_cached": w["num_cached_tokens"]}
                ttft += f" {cv:.3f}/{wv:.3f}"
        # the engine-timestamp rate where the run has it (the wall-clock one subtracts a separate,
        # noisy 1-token run; see profiling/results/2026-11-30/SUMMARY.md)
        d = sc.get("decode", {})
        dec = d.get("engine_decode_tok_per_s") or d.get("decode_tok_per_s")
        row["decode_tok_per_s"] = dec
        # token agreement with the reference configuration
        diffs = []
        for key in ("repeat", "shared", "system", "decode"):
            if key not in sc or key not in res[ref]["scenarios"]:
                continue
            if "runs" not in sc[key] or "runs" not in res[ref]["scenarios"][key]:
                continue
            for i, (x, y) in enumerate(zip(sc[key]["runs"], res[ref]["scenarios"][key]["runs"])):
                d = first_diff(x["tokens"], y["tokens"])
                if d is not None:
                    m1 = x["top2_margins"][d] if d < len(x["top2_margins"]) else None
                    m2 = y["top2_margins"][d] if d < len(y["top2_margins"]) else None
                    diffs.append({"scenario": key, "run": i, "pos": d, "margin": m1, "ref_margin": m2})
            # and across the runs of one configuration (warm vs cold)
            toks = [tuple(x["tokens"]) for x in sc[key]["runs"]]
            if key == "repeat":
                row["repeat_runs_identical"] = len(set(toks)) == 1
        row["token_diffs_vs_ref"] = diffs
        summary["configs"][name] = row
        agree = ("same" if not diffs else f"{len(diffs)} differ") + f" ({ref})"
        print(f"{name:<22} {row['mode']:<6} {row['block']:>4} {row['start_s']:>7}  "
              f"{' '.join(reuse):<45} {ttft:>16}  {dec if dec else '-':>12}  {agree}")
    # time to first token of every run, and Triton compiles after the engine was up (each placed
    # in the scenario that was running; a compile inside a timed request is a latency spike)
    for name, r in res.items():
        row = summary["configs"][name]
        ttfts = {k: [x.get("ttft_s") for x in v["runs"]] for k, v in r["scenarios"].items()
                 if k in ("repeat", "shared", "system")}
        row["ttft_s_per_run"] = ttfts
        comp = r.get("triton_compiles_after_start")
        if comp is not None:
            marks = sorted((t, k) for k, t in r.get("scenario_start_s", {}).items())
            where = {}
            for t, kernel in comp:
                sc = ([k for m, k in marks if m <= t] or ["start-up"])[-1]
                where.setdefault(sc, {}).setdefault(kernel, 0)
                where[sc][kernel] += 1
            row["triton_compiles_after_start"] = where
        print(f"{name}: ttft {ttfts}; Triton compiles after start-up: "
              f"{'not recorded' if comp is None else row['triton_compiles_after_start'] or 'none'}")
    print_bursts(res, summary)
    print_decode_runs(res, summary, read_gpu_monitor(Path(a.dir) / "gpu_monitor.csv"))
    print_load_and_capacity(res, summary)
    print_spec(res, summary)
    print_jit(res, summary)
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    if a.check:
        near_ties = []
        problems = check(res, near_ties)
        for line in near_ties:
            print("near-tie token difference (not a failure): " + line)
        print("check: " + ("passed" if not problems else "FAILED\n  " + "\n  ".join(problems)))
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
