"""GDNPlanner's speculative rows: the slot arithmetic (README "Conventions", speculative decoding)
checked against formulas written here independently, the buffers and tails, validation, and the
two safety properties: a spec row never writes a block that was full before its step, and a
request's next read finds the state after its accepted tokens."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import classify_rows, count_decode_rows

B = 64


def make(max_seqs=8, max_tokens=512, num_slots=256, max_blocks=16, max_spec_len=8):
    return GDNPlanner(PlanLimits(max_seqs, max_tokens, B, num_slots, max_blocks,
                                 max_spec_len=max_spec_len))


def want_writes(n, q, table, ring):
    """The state after m tokens: the block's slot at a boundary, else ring[m % R]."""
    return [table[m // B - 1] if m % B == 0 else ring[m % len(ring)] for m in range(n + 1, n + q + 1)]


def want_read(n, table, ring, accepted):
    if n == 0:
        return NO_SLOT
    return ring[n % len(ring)] if accepted and n % B else table[(n - 1) // B]


def test_classify_rows():
    assert classify_rows([1, 1, 3, 3, 5]) == (2, 0)
    assert classify_rows([1, 1, 3, 3, 5], [0, 0, 1, 1, 0]) == (2, 2)
    assert classify_rows([1, 4, 4], [1, 0, 0]) == (0, 1)   # a 1-token spec row (k = 0)
    assert classify_rows([1, 1], [0, 1]) == (1, 1)
    assert count_decode_rows([1, 3, 1], [0, 1, 0]) == 1
    with pytest.raises(ValueError, match="one k"):
        classify_rows([3, 4], [1, 1])
    with pytest.raises(ValueError, match="before every prefill"):
        classify_rows([1, 70, 3], [0, 0, 1])
    with pytest.raises(ValueError, match="entries"):
        classify_rows([1, 3], [0])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 400), k=st.integers(0, 7), extra=st.integers(0, 3),
       accepted=st.integers(0, 8))
def test_spec_row_slots_follow_the_convention(n, k, extra, accepted):
    q = 1 + k
    ring = list(range(200, 200 + q + 1 + extra))
    accepted = min(accepted, len(ring) - 1) if n else 0
    table = list(range(10, 10 + (n + q - 1) // B + 1))
    p = make()
    step = p.plan([n], [q], [table], spec=[True], rings=[ring], accepted=[accepted])
    h = step.host
    assert (h.num_decodes, h.num_spec, h.spec_len, h.num_prefills) == (0, 1, q, 0)
    assert h.spec_read == (want_read(n, table, ring, accepted),)
    assert h.spec_write == (tuple(want_writes(n, q, table, ring)),)
    assert p.spec_read.tolist()[0] == h.spec_read[0]
    assert p.spec_write[0].tolist() == list(h.spec_write[0]) + [NO_SLOT] * (8 - q)
    assert p.spec_cu.tolist() == [0] + [q] * 8
    assert p.spec_accepted.tolist() == [accepted] + [0] * 7
    # a rejected draft never touches a committed block: every block slot written belongs to a
    # block that ends after n (it was not full before this step)
    for m, s in zip(range(n + 1, n + q + 1), h.spec_write[0]):
        if s in table:
            assert (table.index(s) + 1) * B > n and m % B == 0
    # whatever the verification accepts, the next step reads the state after n + a from where
    # this step stored it
    for a in range(1, q + 1):
        nxt = want_read(n + a, table + [99], ring, a)
        assert nxt == h.spec_write[0][a - 1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 300), accepted=st.integers(1, 5), q=st.integers(1, 130))
def test_any_row_after_a_spec_step_reads_the_ring(n, accepted, q):
    """A decode or prefill row whose previous step was speculative reads ring[n % R] (off a
    boundary) and otherwise follows the ordinary rules."""
    ring = [200 + i for i in range(6)]
    table = list(range(10, 10 + (n + q - 1) // B + 1))
    p = make(max_tokens=1024)
    h = p.plan([n], [q], [table], rings=[ring], accepted=[accepted]).host
    r = h.decode_read if q == 1 else h.prefill_read
    assert r == (want_read(n, table, ring, accepted),)


def test_mixed_step_layout_and_tails():
    p = make()
    _ = NO_SLOT
    ring_a, ring_b = [100, 101, 102, 103, 104], [110, 111, 112, 113]
    step = p.plan([5, 62, 130, 0], [1, 3, 3, 70], [[1], [2, 3], [4, 5, 6], [7, 8]],
                  spec=[0, 1, 1, 0], rings=[None, ring_a, ring_b, None], accepted=[0, 0, 2, 0])
    h = step.host
    assert (h.num_decodes, h.num_spec, h.spec_len, h.num_prefills) == (1, 2, 3, 1)
    assert (step.num_decodes, step.num_spec, step.num_spec_tokens, step.num_prefill_tokens) == \
        (1, 2, 6, 70)
    assert step.num_tokens == 77 == h.num_tokens
    # row 1: n = 62 reads table[0]; 63 -> ring[3], 64 -> table[0] (in place), 65 -> ring[0]
    # row 2: n = 130, accepted: ring[130 % 4] = 112; 131 -> 113, 132 -> 110, 133 -> 111
    assert h.spec_read == (2, 112)
    assert h.spec_write == ((103, 2, 100), (113, 110, 111))
    assert p.spec_cu.tolist() == [0, 3, 6, 6, 6, 6, 6, 6, 6]
    assert p.spec_read.tolist() == [2, 112, _, _, _, _, _, _]
    assert p.spec_write.tolist()[2:] == [[_] * 8] * 6
    assert h.decode_read == (1,) and h.prefill_write == (8,)
    # a later plain step clears every spec buffer
    p.plan([6], [1], [[1]])
    assert p.spec_read.tolist() == [_] * 8 and p.spec_cu.tolist() == [0] * 9
    assert p.spec_write.tolist() == [[_] * 8] * 8


def test_pad_spec_to_and_template():
    p = make()
    ring = [100, 101, 102]
    step = p.plan([10], [2], [[1]], spec=[1], rings=[ring], pad_spec_to=4)
    assert step.num_spec == 4 and step.spec_len == 2 and step.num_tokens == 8
    assert p.spec_cu.tolist() == [0, 2, 4, 6, 8, 8, 8, 8, 8]
    assert p.spec_read.tolist()[:4] == [1, NO_SLOT, NO_SLOT, NO_SLOT]
    t = p.spec_template(4, 2)
    assert (t.num_spec, t.spec_len, t.num_decodes, t.num_prefill_tokens) == (4, 2, 0, 0)
    assert t.spec_write is p.spec_write and t.spec_cu is p.spec_cu
    with pytest.raises(ValueError, match="pad_spec_to"):
        p.plan([10, 0], [2, 70], [[1], [2, 3]], spec=[1, 0], rings=[ring, None], pad_spec_to=4)
    with pytest.raises(ValueError, match="pad_decodes_to"):
        p.plan([10, 3], [1, 2], [[1], [2]], spec=[0, 1], rings=[None, ring], pad_decodes_to=4)


def test_no_spec_limits_keep_the_layout():
    """max_spec_len = 0 (the default, and vLLM's): no spec buffers, every other offset as before."""
    p = GDNPlanner(PlanLimits(8, 512, B, 64, 16))
    sp = p.spans
    assert sp["spec_read"][1] == sp["spec_write"][1] == sp["spec_cu"][1] == 0
    assert sp["read_slot"][0] == sp["decode_write"][0] + 8
    assert len(p.buffers()) == 11
    with pytest.raises(ValueError, match="max_spec_len"):
        p.plan([3], [2], [[1]], spec=[1], rings=[[5, 6, 7]])


@pytest.mark.parametrize("case, match", [
    (dict(rings=[None]), "needs a ring"),
    (dict(rings=[[100, 101]]), "too small"),
    (dict(rings=[[100, 100, 101]]), "distinct"),
    (dict(rings=[[100, 101, 999]]), "outside"),
    (dict(rings=[[100, 101, 102]], accepted=[-1]), "accepted"),
])
def test_spec_validation(case, match):
    p = make(num_slots=256)
    before = p.flat.clone()
    with pytest.raises(ValueError, match=match):
        p.plan([10], [2], [[1]], spec=[1], **case)
    assert p.flat.equal(before)


def test_two_rows_sharing_a_ring_slot_are_refused():
    p = make()
    with pytest.raises(ValueError, match="also writes|which row"):
        p.plan([10, 20], [2, 2], [[1], [2]], spec=[1, 1],
               rings=[[100, 101, 102], [102, 103, 104]])
    with pytest.raises(ValueError, match="max_spec_len"):
        p.plan([10], [9], [[1]], spec=[1], rings=[list(range(100, 110))])
    with pytest.raises(ValueError, match="after 64 tokens goes to block table entry 0"):
        p.plan([62], [4], [[NO_SLOT, 5]], spec=[1], rings=[list(range(100, 108))], accepted=[1])
