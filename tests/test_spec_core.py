"""Speculative rows through the kernels and the GDN core (CPU tier: Triton interpreter).

* conv_decode_multi and gdn_decode_multi equal token-by-token conv_decode / gdn_decode bit for
  bit (outputs, every stored window and state, fp32 and bf16 pools, a write slot equal to the
  read slot), and touch nothing outside their write slots (guarded pools);
* random multi-step plans (hypothesis) mixing decode rows, spec rows with every acceptance count
  and prefill rows, through GDNPlanner + run_gdn_core, against a world that runs only the
  accepted tokens one at a time as plain decode rows: spec_world.simulate's checks (outputs,
  stored states, the next read slot, committed blocks untouched, slots outside the plan
  untouched), bit for bit;
* a batch of spec rows padded to a graph bucket equals the unpadded batch (padded rows store
  nothing).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops import conv_decode, conv_decode_multi, gdn_decode, gdn_decode_multi
from gdn_graphs.ops.workspace import ChunkWorkspace
from gdn_graphs.runtime.core import run_gdn_core
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from helpers import assert_bits_equal, guarded_pool
from spec_world import C as SC, HV as SHV, NUM_SLOTS, V as SV, clone_pools, make_layer, \
    make_pools, simulate

HK, HV, K, V, C, W = 1, 2, 16, 16, 40, 4
_ = NO_SLOT


def multi_vs_token_by_token(device, pool_dtype, in_dtype, seed=0):
    """Rows of 4, 3 and 4 tokens (one of them padding-free in place: token 1 of row 0 writes its
    read slot), against batches of one token per row through the one-token kernels."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(in_dtype).to(device)  # noqa: E731
    lens, reads = [4, 3, 4], [1, 2, _]
    ws = [[3, 1, 4, 5], [6, 7, 8, _], [9, 10, 11, 12]]
    T, N = sum(lens), len(lens)
    x, a, b = rnd(T, C), rnd(T, HV), rnd(T, HV)
    q, k, v = rnd(T, HK, K), rnd(T, HK, K), rnd(T, HV, V)
    conv_w, conv_b = rnd(C, W).float(), rnd(C).float()
    A_log = (torch.rand(HV, generator=g) * 2 - 1).to(device)
    dt_bias = torch.randn(HV, generator=g).to(device)
    cbuf, cpool = guarded_pool(16, (C, W - 1), pool_dtype, device, seed=seed)
    sbuf, spool = guarded_pool(16, (HV, V, K), pool_dtype, device, seed=seed + 1)
    cbuf2, sbuf2 = cbuf.clone(), sbuf.clone()
    cpool2 = cbuf2[1:-1].unflatten(1, cpool.shape[1:])
    spool2 = sbuf2[1:-1].unflatten(1, spool.shape[1:])
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    y = conv_decode_multi(x, conv_w, conv_b, cpool, i32(cu), i32(reads), i32(ws))
    o = gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, spool, i32(cu), i32(reads), i32(ws))
    y2, o2 = torch.empty_like(y), torch.empty_like(o)
    for t in range(max(lens)):
        rows = [i for i in range(N) if t < lens[i]]
        tok = [cu[i] + t for i in rows]
        r = i32([reads[i] if t == 0 else ws[i][t - 1] for i in rows])
        w = i32([ws[i][t] for i in rows])
        y2[tok] = conv_decode(x[tok], conv_w, conv_b, cpool2, r, w)
        o2[tok] = gdn_decode(q[tok], k[tok], v[tok], a[tok], b[tok], A_log, dt_bias, spool2, r, w)
    assert_bits_equal(y, y2, "conv outputs")
    assert_bits_equal(o, o2, "gdn outputs")
    assert_bits_equal(cbuf, cbuf2, "conv pool (guards included)")
    assert_bits_equal(sbuf, sbuf2, "ssm pool (guards included)")


@pytest.mark.parametrize("pool_dtype, in_dtype", [(torch.float32, torch.float32),
                                                  (torch.bfloat16, torch.bfloat16),
                                                  (torch.float32, torch.bfloat16)])
def test_multi_kernels_equal_token_by_token(pool_dtype, in_dtype, device):
    multi_vs_token_by_token(device, pool_dtype, in_dtype)


@pytest.mark.parametrize("width", [2, 3, 6, 8])
def test_conv_multi_every_width(width, device):
    """conv_decode_multi equals conv_decode token by token for every kernel width, without bias,
    with a 0-token row and a row longer than its write-slot table (its tokens past the table are
    computed and stored nowhere; the reference keeps them in two scratch slots of its own)."""
    g = torch.Generator().manual_seed(width)
    x = torch.randn(9, C, generator=g).to(device)
    w = torch.randn(C, width, generator=g).to(device)
    pool = torch.randn(12, C, width - 1, generator=g).to(device)
    p1 = pool.clone()
    p2 = torch.cat([pool, torch.zeros(2, C, width - 1, device=device)])  # + scratch 12, 13
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    reads, ws = [3, 4, _], [[3, 5, 6], [7, 8, 9], [10, 11, 2]]
    y = conv_decode_multi(x, w, None, p1, i32([0, 5, 5, 9]), i32(reads), i32(ws))
    ref_ws = [[3, 5, 6, 12, 13], [], [10, 11, 2, _]]
    y2 = torch.empty_like(y)
    for i, start in enumerate([0, 5, 5]):
        r = reads[i]
        for t, wslot in enumerate(ref_ws[i]):
            y2[start + t] = conv_decode(x[start + t:start + t + 1], w, None, p2, i32([r]),
                                        i32([wslot]))[0]
            r = wslot
    assert_bits_equal(y, y2, "outputs")
    assert_bits_equal(p1, p2[:12], "pool")


@pytest.mark.parametrize("k", [1, 3])
def test_every_acceptance_count(k):
    """Each acceptance a = 1 .. k + 1 (0 .. k drafts accepted), forced for every spec row, over
    steps that cross block boundaries inside spec spans."""
    for a in range(1, k + 2):
        _, done = simulate("cpu", k, steps=3, seed=10 + a, accept=a, num_reqs=3, spec_share=1.0)
        assert done == 3


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), k=st.integers(1, 3),
       pool_dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_random_spec_plans_equal_accepted_tokens_one_at_a_time(seed, k, pool_dtype):
    _, done = simulate("cpu", k, steps=4, seed=seed, pool_dtype=pool_dtype, num_reqs=4)
    assert done >= 1


def test_padded_spec_rows_touch_nothing():
    """A batch of spec rows padded to a bucket (pad_spec_to, what a FULL graph replays) gives the
    real rows' outputs and pools of the unpadded batch bit for bit; padded rows store nothing."""
    k, L = 2, 3
    w = make_layer("cpu", seed=3)
    p = GDNPlanner(PlanLimits(8, 64, 64, NUM_SLOTS, 4, max_spec_len=L))
    ws = ChunkWorkspace(64, SHV, 16, SV, torch.float32, "cpu", HK=1)
    rows = dict(num_computed=[62, 130], num_scheduled=[L, L], block_tables=[[1, 2], [3, 4, 5]],
                spec=[True, True], rings=[[40, 41, 42, 43], [50, 51, 52, 53]], accepted=[0, 2])
    g = torch.Generator().manual_seed(0)
    x, a, b = torch.randn(4 * L, SC, generator=g), torch.randn(4 * L, SHV, generator=g), \
        torch.randn(4 * L, SHV, generator=g)
    results = []
    for pad in (None, 4):
        pools = make_pools("cpu", torch.float32, seed=3)
        step = p.plan(**rows, pad_spec_to=pad)
        T = step.num_tokens
        out = torch.empty(T, SHV, SV)
        run_gdn_core(x[:T], a[:T], b[:T], w, pools, step, out, ws)
        results.append((out[:2 * L].clone(), clone_pools(pools)))
    (o1, p1), (o2, p2) = results
    assert_bits_equal(o1, o2, "real rows' outputs")
    assert_bits_equal(p1.ssm, p2.ssm, "ssm pool")
    assert_bits_equal(p1.conv, p2.conv, "conv pool")
