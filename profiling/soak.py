"""Soak the embedded engine: many steps with random arrivals and aborts, FULL graphs against eager.

    python profiling/soak.py --steps 10000 [--out DIR] [--seed 0] [--preset tiny]

Two engines, each with its own model of the same seeded weights (one in ``full`` mode, one
``eager``, prefix caching on; the state pools live on the model) receive the same schedule, decided by a seeded generator at each step number: new requests
(prompts that share prefixes, so the prefix cache hits, evicts and refills), aborts of running or
waiting requests. At the end every request must have the same status and the same generated tokens
in both engines (float32: bit-identical logits give identical greedy tokens), both caches must pass
their invariant check, and neither the CUDA graph pool (captures, replays only) nor allocated GPU
memory may grow after the first window of steps. Prints a summary line and writes JSON to --out.
Runs on a CPU too (eager only, 20 steps by default: the Triton interpreter is slow; no graphs).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch


def schedule(rng: random.Random, step: int, prefixes: list[list[int]], vocab: int):
    """What happens at ``step``: (new prompts with their max_new_tokens, abort draws)."""
    new = []
    for _ in range(rng.choices((0, 1, 2), (0.6, 0.3, 0.1))[0]):
        base = rng.choice(prefixes)
        cut = rng.randrange(len(base) + 1)
        tail = [rng.randrange(vocab) for _ in range(rng.randrange(1, 90))]
        new.append((base[:cut] + tail, rng.randrange(1, 24)))
    aborts = [rng.random() for _ in range(rng.choices((0, 1), (0.93, 0.07))[0])]
    return new, aborts


def soak(steps: int, seed: int, preset_name: str, window: int, log=print) -> dict:
    from gdn_graphs.engine import Engine, EngineConfig, HybridGDNModel, preset

    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    # one model per engine (the same seeded weights): an engine's state pools live on its model
    common = dict(enable_prefix_caching=True, block_size=64, num_slots=160, max_seqs=8,
                  max_tokens=256, max_model_len=1024, decode_buckets=(1, 2, 4, 8), progress=False)
    modes = ("full", "eager") if gpu else ("eager", "eager")
    engines = [Engine(HybridGDNModel(preset(preset_name), device=dev), EngineConfig(mode=m, **common))
               for m in modes]
    vocab = engines[0].model.cfg.vocab_size
    rng0 = random.Random(seed)
    prefixes = [[rng0.randrange(vocab) for _ in range(rng0.randrange(64, 400))] for _ in range(6)]
    reqs: list[list] = [[], []]
    memory, t0 = [], time.perf_counter()
    for s in range(steps):
        rng = random.Random(seed * 1_000_003 + s)   # the same draws for both engines
        new, aborts = schedule(rng, s, prefixes, vocab)
        for e, eng in enumerate(engines):
            for prompt, n in new:
                reqs[e].append(eng.add_request(prompt, n))
            live = [r for r in reqs[e] if not r.done]
            for u in aborts:
                if live:
                    victim = live[int(u * len(live))]
                    eng.abort(victim)
                    live.remove(victim)
            eng.step()
        if gpu and s % window == 0:
            torch.cuda.synchronize()
            memory.append(torch.cuda.memory_allocated())
    for eng in engines:
        while eng.has_unfinished():
            eng.step()
        eng.cache.check_invariants()
    wall = time.perf_counter() - t0
    a, b = reqs
    mismatches = [i for i, (x, y) in enumerate(zip(a, b))
                  if x.status != y.status or x.output != y.output]
    stats = engines[0]._graphs.stats if engines[0]._graphs is not None else None
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu", "modes": modes, "steps": steps,
        "seed": seed, "preset": preset_name, "requests": len(a),
        "finished": sum(r.status == "finished" for r in a),
        "aborted": sum(r.status == "aborted" for r in a),
        "hit_tokens": sum(r.metrics.hit_tokens for r in a),
        "tokens_generated": sum(len(r.output) for r in a),
        "mismatches": len(mismatches), "first_mismatch": mismatches[:1],
        "graph_captures": stats.captures if stats else 0,
        "graph_replays": stats.replays if stats else 0,
        "memory_allocated_first_last": [memory[1], memory[-1]] if len(memory) > 1 else [],
        "wall_s": round(wall, 1)}
    log(json.dumps(result))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10_000 if torch.cuda.is_available() else 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--window", type=int, default=500, help="steps between memory readings")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    r = soak(args.steps, args.seed, args.preset, args.window)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "soak.json").write_text(json.dumps(r, indent=1))
    mem = r["memory_allocated_first_last"]
    ok = r["mismatches"] == 0 and (not mem or mem[-1] <= mem[0])
    print(f"soak: {r['steps']} steps, {r['requests']} requests ({r['aborted']} aborted), "
          f"{r['hit_tokens']} hit tokens, {r['graph_replays']} graph replays, "
          f"{r['mismatches']} mismatches, memory {mem}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
