"""DeviceTablePlanner (the vLLM builder's planning) against a brute-force oracle of the README's block
arithmetic, written from the formula: no vLLM needed."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.vllm.slots import DeviceTablePlanner, plan_block_size

NULL = 0  # vLLM's null block id


def oracle(n, q, table, B):
    """(read, write, [checkpoint slots]) for one row, with the null block mapped to NO_SLOT."""
    m = lambda x: NO_SLOT if x == NULL else int(x)  # noqa: E731
    read = m(table[(n - 1) // B]) if n > 0 else NO_SLOT
    write = m(table[(n + q - 1) // B])
    ckpts = []
    p = (n // B + 1) * B
    while p < n + q:
        s = m(table[p // B - 1])
        ckpts.append(NO_SLOT if s == write else s)
        p += B
    return read, write, ckpts


def run_case(rows, B, stride, width, max_reqs=8, max_tokens=4096, pad_to=None, seed=0,
             device="cpu", p=None, planner_stride="same"):
    """rows: list of (n, q); q == 0 rows are padding (trailing)."""
    rng = np.random.default_rng(seed)
    R = max(len(rows), max_reqs)
    # engine table: distinct block ids, some null entries before each row's read column
    store = torch.zeros(R, stride, dtype=torch.int32)
    ids = rng.permutation(np.arange(1, R * width + 1)).reshape(R, width)
    store[:, :width] = torch.from_numpy(ids.astype(np.int32))
    store[:, width:] = -7  # beyond the width: never read
    for i, (n, q) in enumerate(rows):
        lo = (n - 1) // B if n > 0 else 0
        if lo > 0:
            store[i, :lo] = NULL  # freed / never-held blocks before the read column
    store = store.to(device)
    bt = store[:max(len(rows), 1), :width]
    if p is None:
        ps = stride if planner_stride == "same" else planner_stride
        p = DeviceTablePlanner(R, max_tokens, B, ps, width, device=device)
    qsl = np.concatenate([[0], np.cumsum([q for _, q in rows])]).astype(np.int32)
    ncomp = np.array([n for n, _ in rows], dtype=np.int32)
    before = store.clone()
    step = p.plan(qsl, ncomp, bt, pad_decodes_to=pad_to)
    assert torch.equal(store, before), "the engine's table is read, never written"
    real = [(n, q) for n, q in rows if q > 0]
    want = [oracle(n, q, store[i, :width].tolist(), B) for i, (n, q) in enumerate(real)]
    if device != "cpu":
        torch.cuda.synchronize()
    nd = 0
    while nd < len(real) and real[nd][1] == 1:
        nd += 1
    assert step.decode_read is p.slots.decode_read and step.prefill is p.slots.prefill
    dr, dw = p.slots.decode_read.tolist(), p.slots.decode_write.tolist()
    assert dr[:nd] == [w[0] for w in want[:nd]]
    assert dw[:nd] == [w[1] for w in want[:nd]]
    assert set(dr[nd:]) <= {NO_SLOT} and set(dw[nd:]) <= {NO_SLOT}
    pre = want[nd:]
    meta = p.slots.prefill
    assert meta.read_slot.tolist()[:len(pre)] == [w[0] for w in pre]
    assert meta.write_slot.tolist()[:len(pre)] == [w[1] for w in pre]
    assert set(meta.read_slot.tolist()[len(pre):]) <= {NO_SLOT}
    offs, ck = meta.ckpt_offsets.tolist(), meta.ckpt_slots.tolist()
    for j, w in enumerate(pre):
        assert ck[offs[j]:offs[j + 1]] == w[2]
    assert set(ck[offs[len(pre)]:]) <= {NO_SLOT}
    assert meta.start_pos.tolist()[:len(pre)] == [n for n, _ in real[nd:]]
    pure = len(real) == nd
    assert step.num_decodes == (pad_to if (pad_to is not None and pure) else nd)
    assert step.num_prefill_tokens == sum(q for _, q in real[nd:])
    return p


@pytest.mark.parametrize("B", [64, 192])
def test_boundaries_decode_and_prefill(B):
    rows = [(B - 1, 1), (B, 1), (B + 1, 1), (0, 1),                 # decodes: in place / crossing
            (0, 3 * B + 5), (B, 2 * B), (B // 2, B), (2 * B + 7, 1)]  # prefills; a late q == 1 row
    run_case(rows, B, stride=40, width=32)


@pytest.mark.parametrize("planner_stride", [None, 33])
def test_table_with_another_row_stride(planner_stride):
    """The planner is sized before the engine's table exists: a table whose row stride is not
    the planner's is gathered through a copy of its used columns, with the same slots."""
    rows = [(63, 1), (64, 1), (0, 200), (100, 300)]
    run_case(rows, 64, stride=40, width=32, planner_stride=planner_stride)


def test_padding_rows_and_decode_bucket():
    p = run_case([(5, 1), (64, 1), (0, 0), (0, 0)], 64, stride=16, width=16, pad_to=4)
    assert p.slots.decode_read.tolist()[2:4] == [NO_SLOT, NO_SLOT]


def test_pad_is_ignored_for_mixed_steps():
    run_case([(5, 1), (0, 100)], 64, stride=16, width=16, pad_to=8)


def test_prefix_caching_off_uses_column_zero():
    """vLLM without prefix caching: one block of max_model_len tokens -> every step in place."""
    B = plan_block_size(32768, prefix_caching=False)
    assert B % 64 == 0 and B >= 32768
    p = run_case([(100, 1), (0, 700), (3000, 64)], B, stride=1, width=1)
    assert p.slots.prefill.ckpt_offsets.tolist()[:3] == [0, 0, 0]


def test_block_size_must_be_chunk_multiple():
    with pytest.raises(ValueError, match="multiple of 64"):
        plan_block_size(144, prefix_caching=True)


def test_bad_input_leaves_previous_plan():
    p = run_case([(64, 1)], 64, stride=8, width=8)
    snap = p.planner.flat.clone()
    bt = torch.arange(1, 9, dtype=torch.int32)[None]
    with pytest.raises(ValueError, match="needs block"):
        p.plan(np.array([0, 600]), np.array([0]), bt)          # past the table's width
    with pytest.raises(ValueError, match="come after"):
        p.plan(np.array([0, 0, 3]), np.array([0, 0]), torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="at least 8 contiguous columns"):
        p.plan(np.array([0, 1]), np.array([0]), torch.ones(1, 7, dtype=torch.int32))
    assert torch.equal(p.planner.flat, snap)


def test_capture_clears_decode_slots():
    p = run_case([(64, 1), (3, 1)], 64, stride=8, width=8)
    p.slots.clear_decode_slots()
    assert set(p.slots.decode_read.tolist()) == {NO_SLOT}
    assert set(p.slots.decode_write.tolist()) == {NO_SLOT}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(1, 300)), min_size=1, max_size=6),
       st.sampled_from([64, 128, 192]), st.integers(0, 3), st.integers(0, 2 ** 16))
def test_random_batches_match_oracle(rows, B, pad_rows, seed):
    rows = sorted(rows, key=lambda r: r[1] != 1)  # vLLM puts decodes first
    width = max((n + q - 1) // B + 1 for n, q in rows) + 1
    run_case(rows + [(0, 0)] * pad_rows, B, stride=width + 3, width=width, seed=seed)


@pytest.mark.gpu
def test_gpu_plans_in_stream_order(gpu):
    """On CUDA the placeholder plan is a non_blocking copy and the rewrite runs after it on the
    same stream: two plans back to back, each checked, the second over the first's buffers."""
    for B in (64, 192):
        p = run_case([(B, 1), (7, 1), (0, 3 * B + 1), (B + 3, 2 * B)], B, stride=24, width=20,
                     device="cuda", seed=B)
        run_case([(2 * B, 1), (1, 2 * B + 5)], B, stride=24, width=20, device="cuda", p=p,
                 seed=B + 1)
        run_case([(0, 0)], B, stride=24, width=20, device="cuda", p=p)  # an empty step
        assert p.planner.flat.device.type == "cuda"


def test_groups_share_one_plan_and_keep_their_own_slots():
    """Two KV-cache groups of one step (two block tables): one host plan, two slot sets, each
    with its own table's ids; the placeholder plan is left for the next group."""
    B = 64
    p = DeviceTablePlanner(4, 1024, B, 8, 8)
    g1, g2 = p.new_slots(), p.new_slots()
    t1 = torch.arange(1, 33, dtype=torch.int32).view(4, 8)
    t2 = t1 + 100
    qsl, n = np.array([0, 1, 1 + 2 * B]), np.array([B, 10])
    s1 = p.plan(qsl, n, t1[:2], slots=g1)
    plans = p.planner.last_step
    s2 = p.plan(qsl, n, t2[:2], slots=g2)
    assert s2.host is s1.host and p.planner.last_step is plans  # planned once
    assert s1.decode_read is g1.decode_read and s2.decode_read is g2.decode_read
    assert g1.decode_read[0].item() == t1[0, 0].item() and g2.decode_read[0].item() == t2[0, 0].item()
    assert g1.decode_write[0].item() == t1[0, 1].item() and g2.decode_write[0].item() == t2[0, 1].item()
    assert g1.prefill.ckpt_slots[0].item() == t1[1, 0].item()
    assert g2.prefill.ckpt_slots[0].item() == t2[1, 0].item()
    assert g1.prefill.cu_seqlens is g2.prefill.cu_seqlens  # token layout shared
    # a new step re-plans; a failed plan leaves no stale cache behind
    with pytest.raises(ValueError):
        p.plan(np.array([0, 5000]), np.array([0]), t1[:1], slots=g1)
    p.plan(qsl, n, t1[:2], slots=g1)
    assert p.planner.last_step is not plans


def test_error_flag_is_reported_once_a_step_late():
    """The kernels' flag (set here by hand, as a kernel ORs a code in) comes back through the next
    steps' plans without a sync, in words; another group's plan of the same step does not poll."""
    B = 64
    seen = []
    p = DeviceTablePlanner(4, 1024, B, 8, 8)
    p.errors.report = lambda code, names: seen.append((code, names))
    t = torch.arange(1, 33, dtype=torch.int32).view(4, 8)

    def step(i, groups=1):  # step i: one decode row at n = B + i and a prefill row
        for _ in range(groups):
            p.plan(np.array([0, 1, 1 + 2 * B]), np.array([B + i, 10]), t[:2])

    step(0)
    step(1)
    assert seen == []
    p.planner.error_flag.fill_(1)  # step 1's kernels met a block id outside the cache
    step(2, groups=3)              # its poll copies the flag (1), then its plan zeroes it
    assert seen == []
    step(3)                        # ... and the next step's poll reports it
    assert seen == [(1, ["slot out of range"])]
    step(4)
    step(5)
    assert len(seen) == 1 and p.planner.error_flag.item() == 0
    p.planner.error_flag.fill_(5)
    step(6)
    step(7)
    assert seen[-1] == (5, ["slot out of range", "chunk or checkpoint table inconsistent"])
    assert p.errors.reported == [1, 5]


@pytest.mark.gpu
def test_gpu_block_id_outside_the_cache_is_reported(gpu):
    """A real kernel on a real out-of-range block id (vLLM's ids never pass the host checks): the
    pool is untouched past its end, and the watch reports ERR_SLOT within two plans, no sync."""
    from gdn_graphs.ops.common import ERR_SLOT
    from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core

    HK, HV, K, V, W, B = 2, 4, 32, 32, 4, 64
    D = 2 * HK * K + HV * V
    p = DeviceTablePlanner(4, 256, B, 8, 8, device="cuda")
    seen = []
    p.errors.report = lambda code, names: seen.append(code)
    slots = 6
    ssm = torch.zeros(slots + 2, HV, V, K, device="cuda")
    conv = torch.zeros(slots + 2, D, W - 1, device="cuda")
    pools = GDNPools(conv[:slots], ssm[:slots])  # two guard slots past the pool's end
    g = torch.Generator(device="cuda").manual_seed(0)
    w = GDNWeights(torch.randn(D, W, device="cuda", generator=g), None,
                   torch.rand(HV, device="cuda", generator=g), torch.rand(HV, device="cuda", generator=g))
    t = torch.tensor([[1, slots + 1, 0, 0, 0, 0, 0, 0]], dtype=torch.int32, device="cuda")  # write id past the pool
    x = torch.randn(1, D, device="cuda", generator=g)
    a, b = torch.randn(1, HV, device="cuda", generator=g), torch.randn(1, HV, device="cuda", generator=g)
    step = p.plan(np.array([0, 1]), np.array([B]), t)
    run_gdn_core(x, a, b, w, pools, step, torch.empty(1, HV, V, device="cuda"), None)
    torch.cuda.synchronize()  # (only so that the first step's copy has surely landed)
    p.plan(np.array([0, 1]), np.array([B + 1]), t)  # the next step: copy enqueued after the kernels
    torch.cuda.synchronize()
    p.plan(np.array([0, 1]), np.array([B + 2]), t)  # the copy has landed: reported
    assert seen == [ERR_SLOT]
    assert ssm[slots:].abs().sum().item() == 0 and conv[slots:].abs().sum().item() == 0


def test_decode_steps_in_the_same_columns_reuse_the_plan():
    """Decode rows that read and write the block columns of the previous plan only gather (no
    host plan, no copy), from the table as it is now; a row crossing a block boundary, another
    padding or a prefill row plans again. A code the kernels set meanwhile is not zeroed by a
    reused plan: it is reported once and stays until the next plan."""
    B = 64
    p = DeviceTablePlanner(4, 1024, B, 8, 8)
    seen = []
    p.errors.report = lambda code, names: seen.append(code)
    t = torch.arange(1, 33, dtype=torch.int32).view(4, 8)
    qsl = np.array([0, 1, 2])

    def decode(n0, n1, table=t, pad=None):
        step = p.plan(qsl, np.array([n0, n1]), table[:2], pad_decodes_to=pad)
        return step, p.slots.decode_read.tolist()[:2], p.slots.decode_write.tolist()[:2]

    s1, r1, w1 = decode(B + 1, 3)       # columns (1, 1) and (0, 0)
    planned = p.planner.last_step
    s2, r2, w2 = decode(B + 2, 4)
    assert s2.host is s1.host and p.planner.last_step is planned  # reused: no plan, no copy
    assert (r2, w2) == (r1, w1) == ([t[0, 1].item(), t[1, 0].item()], [t[0, 1].item(), t[1, 0].item()])
    moved = t.clone()
    moved[0, 1] = 30  # the engine moved a page (an in-place boundary move keeps the column)
    _, r3, w3 = decode(B + 3, 5, table=moved)
    assert r3[0] == w3[0] == 30 and p.planner.last_step is planned  # the table as it is now
    p.planner.error_flag.fill_(1)  # a kernel met an id outside the cache
    decode(B + 4, 6)
    decode(B + 5, 7)
    assert seen == [1] and p.planner.error_flag.item() == 1  # reported; not zeroed by reuse
    s4, r4, w4 = decode(B + 6, B - 1)   # row 1 reaches the end of block 0: columns (0, 0)
    assert p.planner.last_step is planned  # ... are the same as before
    s5, r5, w5 = decode(B + 7, B)       # row 1 crosses: reads column 0, writes column 1
    assert s5.host is not s4.host and p.planner.last_step is not planned
    assert (r5[1], w5[1]) == (t[1, 0].item(), t[1, 1].item())
    assert p.planner.error_flag.item() == 0 and seen == [1]  # the new plan zeroed it
    s6, *_ = decode(B + 8, B + 1, pad=4)  # another padding: planned again
    assert s6.num_decodes == 4 and s6.host is not s5.host


@pytest.mark.parametrize("B", [64, 192])
def test_decode_stretch_matches_oracle_every_step(B):
    """One planner through 3 * B decode steps of rows at random positions (all crossing block
    boundaries at different steps; a row sometimes leaves, the table's ids sometimes change):
    every step's slots are the oracle's, whether the step planned or reused the plan."""
    rng = np.random.default_rng(B)
    width = 8
    p = DeviceTablePlanner(4, 1024, B, width, width)
    t = torch.from_numpy(rng.permutation(np.arange(1, 4 * width + 1)).reshape(4, width)
                         .astype(np.int32))
    n = rng.integers(0, 2 * B, 4)
    rows, replans = 4, 0
    for _ in range(3 * B):
        if rng.random() < 0.05:
            rows = int(rng.integers(1, 5))
        if rng.random() < 0.05:
            t[rng.integers(4), rng.integers(width)] = int(rng.integers(1, 100))
        last = p.planner.last_step
        p.plan(np.arange(rows + 1), n[:rows], t[:rows])
        replans += p.planner.last_step is not last
        want = [oracle(int(n[i]), 1, t[i].tolist(), B) for i in range(rows)]
        assert p.slots.decode_read.tolist()[:rows] == [w[0] for w in want]
        assert p.slots.decode_write.tolist()[:rows] == [w[1] for w in want]
        n += 1
    assert 0 < replans < 3 * B / 2  # most steps reused the plan
