"""GPU tier of the speculative rows (marker gpu; fails without a GPU).

* the multi-token kernels equal token-by-token conv_decode / gdn_decode bit for bit on the GPU;
* random multi-step plans through planner + run_gdn_core equal the accepted tokens one at a time
  (spec_world.simulate's checks), bit for bit;
* a FULL CUDA graph of the GDN core over spec_template(bucket, 1 + k), captured for two buckets
  and replayed >= 100 times after random re-plans (acceptance counts, boundary crossings,
  padding), equals the eager core on a copy of the pools, bit for bit (outputs and both pools).
"""

from __future__ import annotations

import random

import pytest
import torch

from gdn_graphs.runtime.core import GDNPools, run_gdn_core
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from spec_world import B, C, HV, MAX_BLOCKS, NUM_SLOTS, V, make_layer, make_pools, simulate
from test_spec_core import multi_vs_token_by_token

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pool_dtype, in_dtype", [(torch.float32, torch.float32),
                                                  (torch.bfloat16, torch.bfloat16)])
def test_gpu_multi_kernels_equal_token_by_token(pool_dtype, in_dtype, gpu):
    multi_vs_token_by_token(gpu, pool_dtype, in_dtype, seed=3)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 3])
def test_gpu_random_spec_plans_bit_exact(k, pool_dtype, gpu):
    for seed in range(6):
        _, done = simulate(gpu, k, steps=8, seed=100 * k + seed, pool_dtype=pool_dtype, num_reqs=4)
        assert done >= 1
    for a in range(1, k + 2):
        simulate(gpu, k, steps=4, seed=7, pool_dtype=pool_dtype, accept=a, spec_share=1.0)


def _random_spec_plan(p: GDNPlanner, rng: random.Random, rows: int, k: int, bucket: int):
    R = k + 2
    ns, tables, rings, acc = [], [], [], []
    for i in range(rows):
        n = rng.choice([0, rng.randint(1, 200), 63 - rng.randint(0, k), 128 - rng.randint(0, k)])
        ns.append(n)
        tables.append([8 * i + b for b in range(MAX_BLOCKS)])
        rings.append([40 + R * i + j for j in range(R)])
        acc.append(0 if n == 0 else rng.randint(0, k + 1))
    return p.plan(ns, [k + 1] * rows, tables, spec=[True] * rows, rings=rings, accepted=acc,
                  pad_spec_to=bucket)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_gpu_spec_full_graph_replay_equals_eager(pool_dtype, gpu):
    k, buckets, replays = 3, (2, 4), 120
    L = k + 1
    w = make_layer(gpu, seed=5)
    pools = make_pools(gpu, pool_dtype, seed=5)
    eager = GDNPools(pools.conv.clone(), pools.ssm.clone())
    p = GDNPlanner(PlanLimits(max_seqs=8, max_tokens=256, block_size=B, num_slots=NUM_SLOTS,
                              max_blocks_per_seq=MAX_BLOCKS, max_spec_len=L), gpu)
    T = max(buckets) * L
    x = torch.zeros(T, C, device=gpu)
    a = torch.zeros(T, HV, device=gpu)
    b = torch.zeros(T, HV, device=gpu)
    outs = {s: torch.zeros(s * L, HV, V, device=gpu) for s in buckets}
    graphs = {}
    p.plan([], [], [])  # every slot -1: warm-up and capture touch no state
    stream = torch.cuda.Stream()
    for s in sorted(buckets, reverse=True):
        fn = lambda s=s: run_gdn_core(x[:s * L], a[:s * L], b[:s * L], w, pools,  # noqa: E731
                                      p.spec_template(s, L), outs[s])
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graphs[s] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[s]):
            fn()
    rng = random.Random(0)
    g = torch.Generator(device=gpu).manual_seed(0)
    for it in range(replays):
        rows = rng.randint(1, max(buckets))
        s = min(bk for bk in buckets if bk >= rows)
        step = _random_spec_plan(p, rng, rows, k, s)
        for t in (x, a, b):
            t.copy_(torch.randn(t.shape, device=gpu, generator=g))
        eager.conv.copy_(pools.conv)
        eager.ssm.copy_(pools.ssm)
        graphs[s].replay()
        want = torch.empty(s * L, HV, V, device=gpu)
        run_gdn_core(x[:s * L], a[:s * L], b[:s * L], w, eager, step, want)
        torch.cuda.synchronize()
        assert torch.equal(outs[s].view(torch.int32), want.view(torch.int32)), f"replay {it}: outputs"
        assert torch.equal(pools.conv, eager.conv), f"replay {it}: conv pool"
        assert torch.equal(pools.ssm.view(torch.int16 if pool_dtype == torch.bfloat16
                                          else torch.int32),
                           eager.ssm.view(torch.int16 if pool_dtype == torch.bfloat16
                                          else torch.int32)), f"replay {it}: ssm pool"
        assert p.read_errors() == 0
