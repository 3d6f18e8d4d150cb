"""A stack of GDN decode layers (conv + recurrence, one pool per layer) captured once per bucket
and replayed after many new plans: every replay bit-identical to an eager run of the same step.

The GPU test is issue 2's acceptance test (36 layers at Qwen3-Next shapes, >= 100 replays); the
CPU test runs the same check on a tiny stack with a stand-in for CUDA graphs (replay re-runs the
captured function), so the planning, padding and comparison logic is exercised in CI.
"""

import random

import pytest
import torch

from gdn_graphs.ops.conv import conv_decode
from gdn_graphs.ops.decode import gdn_decode
from gdn_graphs.runtime.graphs import GraphManager
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from helpers import RerunBackend


def check_stack(device, *, layers, HK, HV, K, V, buckets, replays, dtype, backend=None, seed=0,
                pdl=False):
    """pdl: the graphs launch the decode kernel with programmatic dependent launch; the eager
    run they are compared with does not."""
    W, B = 4, 64
    C = 2 * HK * K + HV * V
    max_rows = max(buckets)
    num_slots = 2 * max_rows + 8
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    planner = GDNPlanner(PlanLimits(max_seqs=max_rows, max_tokens=max_rows, block_size=B,
                                    num_slots=num_slots, max_blocks_per_seq=64), device)
    ssm = [0.1 * rnd(num_slots, HV, V, K) for _ in range(layers)]
    conv = [rnd(num_slots, C, W - 1).to(dtype) for _ in range(layers)]
    conv_w = [(0.5 * rnd(C, W)).to(dtype) for _ in range(layers)]
    A_log = [torch.rand(HV, generator=gen, device=device).mul(2) for _ in range(layers)]
    dt_bias = [rnd(HV) for _ in range(layers)]
    x = torch.zeros(max_rows, C, dtype=dtype, device=device)   # persistent inputs of the step
    ab = torch.zeros(max_rows, 2 * HV, dtype=dtype, device=device)
    rs, ws = planner.decode_read, planner.decode_write

    def step(n, pdl=False):
        outs = []
        for l in range(layers):
            y = conv_decode(x[:n], conv_w[l], None, conv[l], rs, ws)
            q = y[:, :HK * K].unflatten(1, (HK, K))
            k = y[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
            v = y[:, 2 * HK * K:].unflatten(1, (HV, V))
            outs.append(gdn_decode(q, k, v, ab[:n, :HV], ab[:n, HV:], A_log[l], dt_bias[l], ssm[l], rs, ws,
                                   pdl=pdl))
        return outs

    graph_step = lambda n: step(n, pdl)  # noqa: E731
    gm = GraphManager(buckets, debug_ptrs=True, backend=backend)
    planner.plan([], [], [])  # capture on an empty plan: every slot -1, no state touched
    gm.capture("decode", graph_step, inputs=lambda: [*planner.buffers(), x, ab, *ssm, *conv], progress=False)
    if isinstance(backend, RerunBackend):
        backend.manager, backend.fn = gm, graph_step

    rng = random.Random(seed)
    pools = ssm + conv
    crossings = padded = 0
    for it in range(replays):
        rows = rng.randint(1, max_rows)
        slots = rng.sample(range(num_slots), 2 * rows)
        ns, tables = [], []
        for r in range(rows):
            n = rng.choice([rng.randint(1, 5 * B), rng.randint(1, 5) * B])  # B | n: crosses a block
            tb = [slots[2 * r + (j == n // B)] for j in range(n // B + 1)]
            crossings += (n - 1) // B != n // B
            ns.append(n)
            tables.append(tb)
        pad = gm.padded_size("decode", rows)
        padded += pad > rows
        planner.plan(ns, [1] * rows, tables, pad_decodes_to=pad)
        x.copy_(rnd(max_rows, C).to(dtype))
        ab.copy_(rnd(max_rows, 2 * HV).to(dtype))
        before = [p.clone() for p in pools]
        eager = [o.clone() for o in step(pad)]
        after_eager = [p.clone() for p in pools]
        for p, b in zip(pools, before):
            p.copy_(b)
        outs, size = gm.run("decode", rows, graph_step)
        assert size == pad, (it, size, pad)
        for l, (o, e) in enumerate(zip(outs, eager)):
            assert torch.equal(o[:pad], e), f"replay {it}, layer {l}: output differs from eager"
            assert not o[rows:pad].any(), f"replay {it}, layer {l}: padded rows are not zero"
        for i, (p, e) in enumerate(zip(pools, after_eager)):
            assert torch.equal(p, e), f"replay {it}: pool {i} differs from eager"
    assert crossings > 0 and padded > 0  # both kinds of step were replayed
    assert gm.stats.replays == replays
    return gm


def test_decode_stack_replay_logic_cpu():
    check_stack("cpu", layers=2, HK=1, HV=2, K=16, V=16, buckets=(1, 2, 4), replays=8,
                dtype=torch.float32, backend=RerunBackend())


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_gpu_36_layer_decode_stack_replays_bit_identical(pdl, gpu):
    gm = check_stack(gpu, layers=36, HK=16, HV=32, K=128, V=128, buckets=(1, 2, 4, 8, 16, 32, 64),
                     replays=120 if not pdl else 100, dtype=torch.bfloat16, pdl=pdl)
    assert len(gm.captured) == 7


def test_pdl_needs_a_cuda_device():
    x = torch.zeros(1, 1, 16)
    ab = torch.zeros(1, 1)
    slot = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="pdl=True needs a CUDA device"):
        gdn_decode(x, x, x, ab, ab, torch.zeros(1), torch.zeros(1), torch.zeros(1, 1, 16, 16),
                   slot, slot, pdl=True)
