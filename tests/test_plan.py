"""GDNPlanner: block arithmetic, buffer layout and tails, validation that leaves buffers intact."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_graphs.constants import CHUNK, NO_SLOT
from gdn_graphs.ops.meta import num_checkpoints, num_chunks
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits, StepPlan
from gdn_graphs.runtime.step import checkpoint_blocks, count_decode_rows, read_block, write_block

B = 64


def make(max_seqs=8, max_tokens=1024, block_size=B, num_slots=64, max_blocks=32, device="cpu"):
    return GDNPlanner(PlanLimits(max_seqs, max_tokens, block_size, num_slots, max_blocks), device)


def snapshot(p: GDNPlanner) -> torch.Tensor:
    return p.flat.clone()


def ckpts_of(p: GDNPlanner, i: int) -> list[int]:
    """Checkpoint slots of prefill sequence i, read back from the device buffers."""
    off = p.prefill.ckpt_offsets.tolist()
    return p.prefill.ckpt_slots.tolist()[off[i]:off[i + 1]]


def expected(n, q, table, b=B):
    """Straight from the formulas in the README's Conventions (independent of the planner)."""
    r = table[(n - 1) // b] if n > 0 else NO_SLOT
    w = table[(n + q - 1) // b]
    ck = [table[p // b - 1] for p in range(n + 1, n + q) if p % b == 0]
    return r, w, [NO_SLOT if s == w else s for s in ck]


# ---------------------------------------------------------------- limits


@pytest.mark.parametrize("bs", [0, -64, 32, 100, 65])
def test_limits_reject_bad_block_size(bs):
    with pytest.raises(ValueError, match="block_size"):
        PlanLimits(4, 256, bs, 16, 8)


def test_limits_reject_non_positive():
    with pytest.raises(ValueError, match="max_seqs"):
        PlanLimits(0, 256, 64, 16, 8)
    with pytest.raises(ValueError, match="num_slots"):
        PlanLimits(4, 256, 64, 1.5, 8)


def test_fresh_planner_holds_an_empty_plan():
    p = make()
    assert p.last_step.host.num_tokens == 0 and p.last_step.num_tokens == 0
    assert p.decode_read.tolist() == [NO_SLOT] * 8
    assert p.prefill.cu_seqlens.tolist() == [0] * 9
    assert set(p.prefill.chunk_seq.tolist()) == {-1}
    assert all(t.dtype == torch.int32 and t.is_contiguous() for t in p.buffers())
    assert all(t.data_ptr() % 16 == 0 for t in p.buffers())


# ---------------------------------------------------------------- block arithmetic

TABLE = list(range(10, 42))  # slot of block b is 10 + b


# (n, q, read block, write block, checkpoint blocks) with B = 64, worked by hand
CASES = [
    (B - 1, 1, 0, 0, []),
    (B, 1, 0, 1, []),          # decode crossing into a new block: read != write, no copy
    (B + 1, 1, 1, 1, []),
    (B - 1, B + 5, 0, 2, [0, 1]),   # p = 64, 128 inside (63, 132)
    (B, B + 5, 0, 2, [1]),          # p = 128 inside (64, 133); p = 64 is not strictly inside
    (B + 1, B + 5, 1, 2, [1]),      # p = 128 inside (65, 134)
    (0, 1, None, 0, []),
    (0, B, None, 0, []),            # ends exactly on the boundary: the final state is that block
    (0, B + 1, None, 1, [0]),
    (0, 2 * B, None, 1, [0]),
    (10, 300, 0, 4, [0, 1, 2, 3]),  # p = 64, 128, 192, 256; the first one lands in the read block
    (128, 256, 1, 5, [2, 3, 4]),
]


@pytest.mark.parametrize("n,q,rb,wb,cbs", CASES)
def test_block_arithmetic(n, q, rb, wb, cbs):
    p = make()
    step = p.plan([n], [q], [TABLE]).host
    r = NO_SLOT if rb is None else TABLE[rb]
    w = TABLE[wb]
    assert (r, w, [TABLE[b] for b in cbs]) == expected(n, q, TABLE)
    if q == 1:
        assert (step.num_decodes, step.num_prefills) == (1, 0)
        assert p.decode_read.tolist()[0] == r and p.decode_write.tolist()[0] == w
        assert step.decode_read == (r,) and step.decode_write == (w,)
    else:
        assert (step.num_decodes, step.num_prefills) == (0, 1)
        m = p.prefill
        assert m.read_slot.tolist()[0] == r and m.write_slot.tolist()[0] == w
        assert m.start_pos.tolist()[0] == n
        assert m.cu_seqlens.tolist()[:2] == [0, q]
        assert ckpts_of(p, 0) == [TABLE[b] for b in cbs]
        assert len(cbs) == num_checkpoints(n, q, B)
        assert step.num_chunks == num_chunks(n, q)


def test_block_size_128_several_blocks():
    p = make(block_size=128, max_tokens=2048)
    n, q = 100, 700  # p = 128 .. 768 step 128: 6 checkpoints, blocks 0..5, write block 6
    p.plan([n], [q], [TABLE])
    assert p.prefill.read_slot.tolist()[0] == TABLE[0]
    assert p.prefill.write_slot.tolist()[0] == TABLE[6]
    assert ckpts_of(p, 0) == TABLE[0:6]


def test_null_checkpoint_entries_store_nothing():
    p = make()
    table = [10, NO_SLOT, 12, NO_SLOT, 14]
    p.plan([10], [300], [table])
    assert ckpts_of(p, 0) == [10, NO_SLOT, 12, NO_SLOT]
    assert p.prefill.write_slot.tolist()[0] == 14


def test_repeated_slot_table_stores_checkpoints_as_no_slot():
    """An engine without prefix caching passes one slot for every block."""
    p = make()
    step = p.plan([100, 0, 5], [300, 200, 1], [[7] * 8, [9] * 8, [3] * 8]).host
    assert step.num_prefills == 3
    m = p.prefill
    assert m.read_slot.tolist()[:3] == [7, NO_SLOT, 3]
    assert m.write_slot.tolist()[:3] == [7, 9, 3]
    assert ckpts_of(p, 0) == [NO_SLOT] * 5  # p = 128, 192, 256, 320, 384
    assert ckpts_of(p, 1) == [NO_SLOT] * 3  # p = 64, 128, 192
    assert ckpts_of(p, 2) == []


def test_rows_may_share_a_read_slot():
    """Two requests resuming from the same cached prefix block both read it."""
    p = make()
    p.plan([B, B], [100, 1], [[5, 6, 7], [5, 8, 9]])
    assert p.prefill.read_slot.tolist()[:2] == [5, 5]
    assert p.prefill.write_slot.tolist()[:2] == [7, 8]


def test_tables_as_tensors_and_numpy():
    import numpy as np
    p = make()
    tables = torch.tensor([TABLE[:8], TABLE[8:16]])
    p.plan(torch.tensor([65, 3]), np.array([1, 200]), tables)
    assert p.decode_read.tolist()[0] == TABLE[1]
    assert p.prefill.read_slot.tolist()[0] == TABLE[8]
    assert p.prefill.write_slot.tolist()[0] == TABLE[8 + 3]


# ---------------------------------------------------------------- batch layout


def test_mixed_batch_decodes_first_and_tails():
    p = make(max_seqs=8)
    tabs = [[1, 2], [3, 4], [5, 6, 7], [8, 9], [10, 11]]
    ns = [70, 63, 10, 0, 64]
    qs = [1, 1, 120, 64, 1]  # the last row schedules 1 token but follows a prefill: prefill row
    step = p.plan(ns, qs, tabs).host
    assert isinstance(step, StepPlan)
    assert (step.num_decodes, step.num_prefills, step.padded_decodes) == (2, 3, 2)
    assert (step.num_tokens, step.num_prefill_tokens) == (187, 185)
    assert p.decode_read.tolist() == [2, 3] + [NO_SLOT] * 6
    assert p.decode_write.tolist() == [2, 3] + [NO_SLOT] * 6
    m = p.prefill
    # cu_seqlens relative to the first prefill token, tail repeats the last value
    assert m.cu_seqlens.tolist() == [0, 120, 184, 185, 185, 185, 185, 185, 185]
    assert m.start_pos.tolist()[:3] == [10, 0, 64]
    assert m.read_slot.tolist() == [5, NO_SLOT, 10] + [NO_SLOT] * 5
    assert m.write_slot.tolist() == [7, 8, 11] + [NO_SLOT] * 5
    assert m.ckpt_offsets.tolist() == [0, 2, 2, 2] + [2] * 5  # p = 64, 128 inside (10, 130)
    assert m.ckpt_slots.tolist() == [5, 6] + [NO_SLOT] * (m.ckpt_slots.numel() - 2)
    nch = num_chunks(10, 120) + num_chunks(0, 64) + num_chunks(64, 1)
    assert step.num_chunks == nch == 5  # 10..63, 64..127, 128..129 | 0..63 | 64
    assert m.chunk_seq.tolist() == [0, 0, 0, 1, 2] + [-1] * (m.max_chunks - nch)
    assert m.chunk_idx.tolist() == [0, 1, 2, 0, 0] + [-1] * (m.max_chunks - nch)
    assert step.prefill_ckpts == ((5, 6), (), ())


def test_previous_prefill_cleared_by_pure_decode_step():
    p = make()
    p.plan([0, 0], [100, 200], [[1, 2], [3, 4, 5, 6]])
    fresh = make()
    step = p.plan([5, 9], [1, 1], [[1], [3]]).host
    assert step.is_pure_decode
    fresh.plan([5, 9], [1, 1], [[1], [3]])
    assert torch.equal(p.flat, fresh.flat)


def test_plan_returns_a_step_over_the_persistent_buffers():
    """The GDNStep launches the padded decode count and the real prefill tokens, over views of
    the planner's buffers (so a graph captured with it replays later plans)."""
    p = make(max_seqs=8)
    step = p.plan([3, 64], [1, 1], [[1], [2, 3]], pad_decodes_to=4)
    assert (step.num_decodes, step.num_prefill_tokens, step.num_tokens) == (4, 0, 4)
    assert step.decode_read is p.decode_read and step.decode_write is p.decode_write
    assert step.prefill is p.prefill and step.host.num_decodes == 2
    mixed = p.plan([3, 0, 10], [1, 130, 2], [[1], [4, 5, 6], [7]])
    assert (mixed.num_decodes, mixed.num_prefill_tokens) == (1, 132) and mixed.host.num_prefills == 2
    t = p.template(8)
    assert (t.num_decodes, t.num_prefill_tokens, t.host) == (8, 0, None)
    assert t.decode_read is p.decode_read


@pytest.mark.parametrize("qs,nd", [([], 0), ([1, 1, 1], 3), ([1, 5, 1], 1), ([7, 1], 0), ([1], 1)])
def test_decode_rows_are_the_leading_one_token_rows(qs, nd):
    assert count_decode_rows(qs) == nd


def test_block_arithmetic():
    B = 64
    assert read_block(0, B) == -1 and read_block(64, B) == 0 and read_block(65, B) == 1
    assert write_block(64, 1, B) == 1 and write_block(0, 64, B) == 0
    # states after 128 and 192 tokens: blocks 1 and 2; the final state (after 200) in block 3
    assert list(checkpoint_blocks(100, 100, B)) == [1, 2] and write_block(100, 100, B) == 3
    assert list(checkpoint_blocks(64, 64, B)) == []   # ends on a boundary: that is the write


def test_pad_decodes_to():
    p = make(max_seqs=8)
    step = p.plan([3, 64, 200], [1, 1, 1], [[1], [2, 3], [4, 5, 6, 7]], pad_decodes_to=8).host
    assert (step.num_decodes, step.padded_decodes, step.num_tokens) == (3, 8, 3)
    assert p.decode_read.tolist() == [1, 2, 7] + [NO_SLOT] * 5
    assert p.decode_write.tolist() == [1, 3, 7] + [NO_SLOT] * 5
    assert p.plan([3], [1], [[1]], pad_decodes_to=1).host.padded_decodes == 1
    assert p.plan([], [], [], pad_decodes_to=4).host.padded_decodes == 4


def test_buffers_never_reallocated():
    p = make()
    bufs = p.buffers()
    ptrs = [t.data_ptr() for t in bufs]
    meta = p.prefill
    batches = [
        ([0], [700], [TABLE]),
        ([5, 9, 0], [1, 1, 64], [[1], [2], [3]]),
        ([1] * 8, [1] * 8, [[i] for i in range(8)]),
        ([], [], []),
    ]
    for args in batches * 2:
        p.plan(*args)
        assert p.prefill is meta
        assert [t.data_ptr() for t in p.buffers()] == ptrs
        assert all(a is b for a, b in zip(p.buffers(), bufs))


# ---------------------------------------------------------------- validation

LIMITS = dict(max_seqs=4, max_tokens=512, num_slots=32, max_blocks=8)

BAD = [
    # (num_computed, num_scheduled, block_tables, kwargs, message fragment)
    ([0, 0], [1], [[1], [2]], {}, "differ in length"),
    ([0] * 5, [1] * 5, [[i] for i in range(5)], {}, "max_seqs"),
    ([0, 0], [300, 300], [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], {}, "max_tokens"),
    ([0, 0], [1, 0], [[1], [2]], {}, "row 1"),
    ([0, -1], [1, 1], [[1], [2]], {}, "row 1"),
    ([0, 1.0], [1, 1], [[1], [2]], {}, "row 1"),
    ([0, 0], [1, True], [[1], [2]], {}, "row 1"),
    ([0, 100], [1, 100], [[1], [2, 3]], {}, "row 1: block table has 2 entries"),   # needs block 3
    ([0, 64], [1, 1], [[1], [2]], {}, "row 1: block table has 1 entries"),
    ([0, 0], [1, 1], [[1], [32]], {}, "row 1: block table entry 0 = 32"),
    ([0, 0], [1, 1], [[1], [-2]], {}, "row 1: block table entry 0 = -2"),
    ([0, 0], [1, 1], [[1], [2.0]], {}, "row 1: block table entry 0 is not an int"),
    ([0, 0], [1, 1], [[1], ["2"]], {}, "row 1: block table entry 0 is not an int"),
    ([0, 64], [1, 1], [[1], [NO_SLOT, 2]], {}, "row 1: read slot"),
    ([0, 0], [1, 1], [[1], [NO_SLOT]], {}, "row 1: write slot"),
    ([0, 0], [1, 1], [[1], [1]], {}, "row 1: writes slot 1, which row 0"),                 # final/final
    ([0, 0], [1, 100], [[1], [1, 2]], {}, "row 1: writes slot 1, which row 0"),            # ckpt/final
    ([0, 0], [100, 100], [[3, 1], [3, 2]], {}, "row 1: writes slot 3, which row 0"),      # ckpt/ckpt
    ([0, 64], [1, 1], [[1], [1, 2]], {}, "row 1: reads slot 1, which row 0"),
    ([64, 0], [1, 1], [[1, 2], [1]], {}, "row 0: reads slot 1, which row 1"),
    ([0], [200], [[5, 5, 6, 7]], {}, "row 0: writes slot 5 twice"),
    ([0], [1], [[1] * 9], {}, "row 0: block table has 9 entries, more than max_blocks_per_seq"),
    ([0, 0], [1, 1], [[1], [2]], dict(pad_decodes_to=1), "smaller"),
    ([0, 0], [1, 1], [[1], [2]], dict(pad_decodes_to=5), "larger than max_seqs"),
    ([0, 0], [1, 2], [[1], [2]], dict(pad_decodes_to=4), "row 1"),
]


@pytest.mark.parametrize("ns,qs,tabs,kw,msg", BAD)
def test_bad_input_raises_and_leaves_buffers_intact(ns, qs, tabs, kw, msg):
    p = make(**LIMITS)
    good = p.plan([70, 0, 10], [1, 130, 200], [[20, 21], [22, 23, 24], [25, 26, 27, 28]])
    before = snapshot(p)
    with pytest.raises(ValueError, match=msg):
        p.plan(ns, qs, tabs, **kw)
    assert torch.equal(p.flat, before)
    assert p.last_step is good


def test_pad_decodes_to_must_be_int():
    p = make()
    with pytest.raises(ValueError, match="pad_decodes_to"):
        p.plan([0], [1], [[1]], pad_decodes_to=2.0)


def test_in_place_decode_and_resume_block_checkpoint_allowed():
    """A row may read and write its own slot (decode inside a block) and store its first
    checkpoint in the block it resumed from (that block is finished by this step)."""
    p = make()
    p.plan([10, 10], [1, 100], [[1], [2, 3]])
    assert p.decode_read.tolist()[0] == p.decode_write.tolist()[0] == 1
    assert p.prefill.read_slot.tolist()[0] == 2 and ckpts_of(p, 0) == [2]


# ---------------------------------------------------------------- property tests


@st.composite
def batches(draw, max_seqs=6, num_slots=64, max_blocks=12, b=B, unique=True, max_start_blocks=6):
    rows = draw(st.integers(0, max_seqs))
    nd = draw(st.integers(0, rows))
    ns, qs = [], []
    for i in range(rows):
        n = draw(st.integers(0, max_start_blocks * b))
        if i < nd:
            q = 1
        else:
            q = draw(st.integers(2, min(3 * b, max_blocks * b - n)))
        ns.append(n)
        qs.append(q)
    if unique:
        perm = draw(st.permutations(range(num_slots)))
        pool = iter(perm)
    tables = []
    for n, q in zip(ns, qs):
        need = (n + q - 1) // b + 1
        width = draw(st.integers(need, max_blocks))
        if unique:
            row = [next(pool) if k >= max(n - 1, 0) // b and k < need else draw(st.integers(-1, num_slots - 1))
                   for k in range(width)]
            # NO_SLOT for some checkpoint blocks (store nothing) but never the read/write block
            for k in range(n // b, need - 1):
                if k != (n - 1) // b and draw(st.booleans()):
                    row[k] = NO_SLOT
        else:
            row = [draw(st.integers(-1, num_slots - 1)) for _ in range(width)]
        tables.append(row)
    return ns, qs, tables


def _chunks_cover_exactly_once(p: GDNPlanner, step: StepPlan, ns, qs):
    m = p.prefill
    cseq, cidx = m.chunk_seq.tolist(), m.chunk_idx.tolist()
    live = [c for c in cseq if c >= 0]
    assert cseq[:len(live)] == live and len(live) == step.num_chunks       # idle entries at the tail
    assert all(i == -1 for i in cidx[len(live):])
    cu = m.cu_seqlens.tolist()
    for s, (n, q) in enumerate(zip(ns, qs)):
        assert cu[s + 1] - cu[s] == q
        covered = []
        for c, (seq, j) in enumerate(zip(cseq, cidx)):
            if seq != s:
                continue
            lo = max((n // CHUNK + j) * CHUNK, n)
            hi = min((n // CHUNK + j + 1) * CHUNK, n + q)
            assert lo < hi, "a chunk with no tokens"
            covered.extend(range(lo, hi))
        assert covered == list(range(n, n + q))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_property_slots_match_formulas(batch):
    ns, qs, tables = batch
    p = make(max_seqs=6, max_tokens=6 * 3 * B, num_slots=64, max_blocks=12)
    step = p.plan(ns, qs, tables).host
    d = step.num_decodes
    assert all(q == 1 for q in qs[:d]) and (d == len(qs) or qs[d] > 1)
    dr, dw = p.decode_read.tolist(), p.decode_write.tolist()
    m = p.prefill
    pr, pw = m.read_slot.tolist(), m.write_slot.tolist()
    for i, (n, q, t) in enumerate(zip(ns, qs, tables)):
        r, w, ck = expected(n, q, t)
        if i < d:
            assert (dr[i], dw[i], ck) == (r, w, [])
        else:
            s = i - d
            assert (pr[s], pw[s], ckpts_of(p, s)) == (r, w, ck)
            assert m.start_pos.tolist()[s] == n
    assert dr[d:] == dw[d:] == [NO_SLOT] * (6 - d)
    assert pr[len(ns) - d:] == pw[len(ns) - d:] == [NO_SLOT] * (6 - len(ns) + d)
    _chunks_cover_exactly_once(p, step, ns[d:], qs[d:])


def _oracle_ok(ns, qs, tables, b=B, num_slots=48):
    """Independent statement of which batches are legal (tables drawn in range, long enough)."""
    writes, reads = [], []
    for i, (n, q, t) in enumerate(zip(ns, qs, tables)):
        r, w, ck = expected(n, q, t, b)
        if w == NO_SLOT or (n > 0 and r == NO_SLOT):
            return False
        mine = [w] + [s for s in ck if s != NO_SLOT]
        if len(set(mine)) != len(mine):
            return False
        writes += [(s, i) for s in mine]
        if n > 0:
            reads.append((r, i))
    owner = {}
    for s, i in writes:
        if s in owner:
            return False
        owner[s] = i
    return all(owner.get(r, i) == i for r, i in reads)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(num_slots=12, unique=False))
def test_property_accepts_exactly_the_legal_batches(batch):
    ns, qs, tables = batch
    p = make(max_seqs=6, max_tokens=6 * 3 * B, num_slots=12, max_blocks=12)
    p.plan([0], [1], [[0]])
    before = snapshot(p)
    ok = _oracle_ok(ns, qs, tables, num_slots=12)
    if ok:
        step = p.plan(ns, qs, tables).host
        assert step.num_seqs == len(ns)
    else:
        with pytest.raises(ValueError, match=r"row \d+"):
            p.plan(ns, qs, tables)
        assert torch.equal(p.flat, before)


@st.composite
def decode_batches(draw, num_slots=10, width=4):
    """Decode rows only (one token each) over small, clashing tables: NO_SLOT entries, slots
    shared between rows, positions past the table."""
    rows = draw(st.integers(1, 6))
    ns = [draw(st.integers(0, (width + 1) * B - 1)) for _ in range(rows)]
    tables = [[draw(st.integers(-1, num_slots - 1)) for _ in range(width)] for _ in range(rows)]
    return ns, tables


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decode_batches(), st.booleans())
def test_property_decode_steps_from_arrays_plan_as_row_by_row(batch, arrays):
    """An integer-array table (vLLM's placeholders) takes the vectorised decode path
    (step.decode_rows, plan._decode_slots_ok), lists take the row-by-row one: the same plan, the
    same buffers, or the same error."""
    import numpy as np

    ns, tables = batch
    qs = [1] * len(ns)

    def plan(p, *args):
        before = snapshot(p)
        try:
            return p.plan(*args).host, snapshot(p)
        except ValueError as e:
            assert torch.equal(p.flat, before)
            return str(e), None

    rowwise = plan(make(max_seqs=6, num_slots=10, max_blocks=4), ns, qs, tables)
    counts = (np.array(ns), np.array(qs)) if arrays else (ns, qs)
    vector = plan(make(max_seqs=6, num_slots=10, max_blocks=4), *counts, np.array(tables))
    assert rowwise[0] == vector[0]
    assert (rowwise[1] is None and vector[1] is None) or torch.equal(rowwise[1], vector[1])


def test_decode_step_from_arrays_rejects_bad_counts():
    import numpy as np

    p = make()
    with pytest.raises(ValueError, match="row 1: needs num_scheduled >= 1"):
        p.plan(np.array([3, 4]), np.array([1, 0]), np.array([[1], [2]]))
    with pytest.raises(ValueError, match="row 0: num_computed and num_scheduled must be ints"):
        p.plan(np.array([[3], [4]]), np.array([[1], [1]]), np.array([[1], [2]]))


@pytest.mark.parametrize("ns, tables, msg", [
    ([B + 5, B], [[4, 5], [5, 6]], r"row 1: reads slot 5, which row 0 writes"),
    ([B + 5, B + 7], [[4, 5], [6, 5]], r"row 1: writes slot 5, which row 0 also writes"),
    ([B + 5, B], [[4, 5], [4, 6]], None),       # two rows read one slot
    ([5, B + 1], [[4, 5], [6, 6]], None),       # in place (reads the slot it writes)
    ([0, 2 * B], [[5, -1], [1, 2]], r"row 1: block table has 2 entries but n=128, q=1"),
    ([3, 2], [[7, 1], [-1, 2]], r"row 1: read slot is -1 but n=2"),
    ([3, 2], [[7, 1], [10, 2]], r"row 1: block table entry 0 = 10 is outside \[-1, 10\)"),
])
def test_decode_steps_from_arrays_check_the_slot_rules(ns, tables, msg):
    import numpy as np

    for args in ((ns, [1] * len(ns), tables), (np.array(ns), np.ones(len(ns), np.int64),
                                                np.array(tables))):
        p = make(max_seqs=4, num_slots=10, max_blocks=2)
        if msg is None:
            assert p.plan(*args).host.num_decodes == len(ns)
        else:
            with pytest.raises(ValueError, match=msg):
                p.plan(*args)
