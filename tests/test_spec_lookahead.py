"""The lookahead layout (vLLM with speculative decoding; README "Conventions") through the
planner, the multi-token kernels and the GDN core (CPU tier: Triton interpreter).

Random multi-step plans where every short row is a spec row of 1 .. 1 + k tokens (a decode row
is a spec row of one token, a verifying row accepts 1 .. its length) and longer rows are prefill
rows, every state placed by position (``lookahead_column``), against spec_world's truth world that
runs only the accepted tokens one at a time as plain decode rows: outputs of the accepted tokens
bit for bit, committed blocks' slots never written and equal to the truth's, slots outside the
plan untouched, and the slot ``lookahead_column(n)`` of every request holding the truth's state
(and conv window) after its n tokens, whatever the previous step accepted.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import lookahead_column
from spec_world import B, MAX_BLOCKS, NUM_SLOTS, Sim


class LookaheadSim(Sim):
    """spec_world's Sim with the lookahead layout: tables of MAX_BLOCKS + R columns, no rings."""

    def __init__(self, device, k, pool_dtype=torch.float32, seed=0, num_reqs=3):
        super().__init__(device, k, pool_dtype, seed, num_reqs)
        self.R = R = k + 1  # the fewest columns the layout needs (vLLM's spec_lookahead)
        width = MAX_BLOCKS + R
        assert num_reqs * width <= NUM_SLOTS
        lim = PlanLimits(max_seqs=8, max_tokens=256, block_size=B, num_slots=NUM_SLOTS,
                         max_blocks_per_seq=width, max_spec_len=k + 1, lookahead=R)
        self.planner = GDNPlanner(lim, device)
        self.truth_planner = GDNPlanner(replace(lim, max_spec_len=0, lookahead=0), device)
        for r in self.reqs:  # the truth world uses the first MAX_BLOCKS columns, as before
            r.table = [width * r.rid + c for c in range(width)]
            if r.n:  # the starting state, where each world keeps it
                s, t = r.table[lookahead_column(r.n, B, R)], r.table[(r.n - 1) // B]
                self.real.ssm[s], self.real.conv[s] = self.truth.ssm[t], self.truth.conv[t]
        self.lengths = set()

    def _choose(self):
        rows = []
        for r in self.reqs:
            if r.n + self.k + 1 > MAX_BLOCKS * B:
                continue
            if r.prompt_left > self.k + 1:
                q = min(r.prompt_left, self.rng.choice([self.k + 2, 9, 20]))
                rows.append((r, "prefill", q, 0))
            elif r.prompt_left:  # a short prompt tail: a spec row whose tokens are all true (the
                # truth runs them one at a time, as it runs accepted tokens: the decode kernel's
                # arithmetic, which the multi-token kernels repeat bit for bit)
                rows.append((r, "spec", r.prompt_left, r.prompt_left))
            else:
                q = self.rng.randint(1, self.k + 1)
                rows.append((r, "spec", q, self.rng.randint(1, q)))
        return sorted(rows, key=lambda t: t[1] == "prefill")

    def step(self):
        rows = self._choose()
        if not rows:
            return False
        inputs = []
        for r, kind, q, a in rows:
            for j in range(q):
                true = self._true(r, r.n + j)
                inputs.append(true if kind != "spec" or j < a else self._rand())
        step = self.planner.plan([r.n for r, *_ in rows], [q for _, _, q, _ in rows],
                                 [r.table for r, *_ in rows],
                                 spec=[kind == "spec" for _, kind, _, _ in rows])
        before = [t.clone() for t in self.real]
        out = self._forward(self.real, step, inputs)
        self._check_untouched(type(self.real)(*before), step.host, rows)
        want = self._truth(rows)
        for (r, kind, q, a), got in zip(rows, self._split(out, rows)):
            keep = a if kind == "spec" else q
            assert torch.equal(got[:keep], want[r.rid]), f"req {r.rid} ({kind}): outputs differ"
            if kind == "spec":
                self.lengths.add((q, a))
        for r, kind, q, a in rows:
            r.n += a if kind == "spec" else q
            r.prompt_left = max(r.prompt_left - (a if kind == "spec" else q), 0)
        self._check_reads()
        return True

    def _check_reads(self):
        for r in self.reqs:
            for blk in range(r.n // B):
                s = r.table[blk]
                assert torch.equal(self.real.ssm[s], self.truth.ssm[s]), f"req {r.rid} block {blk}"
                assert torch.equal(self.real.conv[s], self.truth.conv[s]), f"req {r.rid} block {blk}"
            if r.n == 0:
                continue
            s = r.table[lookahead_column(r.n, B, self.R)]
            t = r.table[(r.n - 1) // B]
            assert torch.equal(self.real.ssm[s], self.truth.ssm[t]), f"req {r.rid}: next read state"
            assert torch.equal(self.real.conv[s], self.truth.conv[t]), f"req {r.rid}: next window"


@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (3, 2)])
def test_lookahead_layout_equals_accepted_tokens_one_at_a_time(k, seed):
    _run_lookahead_sim("cpu", k, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (3, 2), (2, 3)])
def test_gpu_lookahead_layout_equals_accepted_tokens_one_at_a_time(k, seed, gpu):
    """The same with the compiled kernels: with R = k + 1 a full span's last state goes to the
    slot its row read from, which the multi-token kernels must load before they store."""
    _run_lookahead_sim(gpu, k, seed)


def _run_lookahead_sim(device, k, seed):
    sim = LookaheadSim(device, k, seed=seed)
    sim._check_reads()
    for _ in range(14):
        sim.step()
    # spec rows of several lengths, and full-length rows with more than one acceptance count
    assert len({q for q, _ in sim.lengths}) > 1
    assert len({a for q, a in sim.lengths if q == k + 1}) > 1


def test_lookahead_planner_refuses_what_it_cannot_place():
    lim = dict(max_seqs=4, max_tokens=64, block_size=B, num_slots=64, max_blocks_per_seq=8)
    with pytest.raises(ValueError, match="at least k \\+ 1 = 3"):
        PlanLimits(**lim, max_spec_len=3, lookahead=2)
    p = GDNPlanner(PlanLimits(**lim, max_spec_len=3, lookahead=3), "cpu")
    with pytest.raises(ValueError, match="needs entry 5"):  # state after 130: 2 + 1 + 128 % 3
        p.plan([129], [2], [[0, 1, 2, 3, 4]], spec=[True])
    with pytest.raises(ValueError, match="entry 3, which is -1"):
        p.plan([65], [3], [[0, 1, 2, -1, 4, 5, 6, 7]], spec=[True])
    with pytest.raises(ValueError, match="more than max_spec_len=3"):
        p.plan([1], [4], [[0, 1, 2, 3, 4, 5, 6, 7]], spec=[True])
    step = p.plan([62, 5], [3, 1], [list(range(8)), list(range(8, 16))], spec=[True, True])
    # c + 1 + (m - c) % 3: 63 -> 1, 64 -> block 0, 65 -> 2 + 64 % 3 = 3, which row 0 also reads
    # (62 -> 1 + 62 % 3 = 3: the last state of a full span goes where its first was read from)
    assert step.host.spec_write == ((1 + 63 % 3, 0, 1 + 1 + 64 % 3), (8 + 1 + 6 % 3,))
    assert step.host.spec_read == (1 + 62 % 3, 8 + 1 + 5 % 3)
    assert step.num_spec_tokens == 4 and step.spec_len == 3
    assert step.spec_cu[:3].tolist() == [0, 3, 4]


@pytest.mark.parametrize("seed", range(4))
def test_batched_spec_rows_equal_row_by_row(seed):
    """lookahead_spec_rows (the planner's path for a step of spec rows over an integer numpy
    table, what vLLM's builder passes) gives what lookahead_row_slots gives row by row, and None
    exactly where a row would raise; the planner's plans and errors are the same either way."""
    import numpy as np

    from gdn_graphs.runtime.step import lookahead_row_slots, lookahead_spec_rows

    rng = np.random.default_rng(seed)
    R, width = 5, 9
    for trial in range(200):
        rows = int(rng.integers(1, 6))
        ns = rng.integers(0, (width - R) * B, rows).tolist()
        qs = rng.integers(1, R - 1, rows).tolist()
        tables = rng.permutation(64 * width)[:rows * width].reshape(rows, width)
        if trial % 3 == 0:  # some holes: a slot a row needs may be missing
            tables[rng.random(tables.shape) < 0.1] = -1
        if trial % 5 == 0:
            tables = tables[:, :int(rng.integers(1, width))]  # too narrow for some rows
        try:
            want = [lookahead_row_slots(i, ns[i], qs[i], tables[i], B, R, True)
                    for i in range(rows)]
        except ValueError:
            want = None
        got = lookahead_spec_rows(ns, qs, tables, B, R)
        if want is None:
            assert got is None
            continue
        assert got == ([w[0] for w in want], [w[1] for w in want], [w[2] for w in want])
    p = GDNPlanner(PlanLimits(max_seqs=4, max_tokens=64, block_size=B, num_slots=64,
                              max_blocks_per_seq=8, max_spec_len=3, lookahead=4), "cpu")
    tables = np.arange(16).reshape(2, 8)
    a = p.plan([62, 5], [3, 1], tables, spec=[True, True]).host
    b = p.plan([62, 5], [3, 1], tables.tolist(), spec=[True, True]).host
    assert a == b
    holed = np.array([[0, 1, 2, -1, 4, 5, 6, 7]])
    with pytest.raises(ValueError, match="entry 3, which is -1"):
        p.plan([65], [3], holed, spec=[True])


def test_vllm_builder_refuses_a_verifying_row_after_a_long_row():
    """vLLM sorts rows of up to 1 + k tokens first; were a row with drafts to come after a longer
    one, it would run as a prefill row and lose the states after its drafts: refused."""
    import numpy as np

    from gdn_graphs.vllm.builder import GDNResources, StepBuilder

    k = 3
    sb = StepBuilder(GDNResources(max_reqs=4, max_tokens=512, num_spec_tokens=k), B, 8 + k + 2,
                     0, torch.device("cpu"))
    table = torch.arange(1, 1 + 2 * (8 + k + 2), dtype=torch.int32).view(2, 8 + k + 2)
    qsl = np.array([0, 4, 304])
    ok = sb.build(qsl, np.array([104, 300]), table, 2, drafts=np.array([3, -1]))
    assert (ok.num_spec, ok.spec_len, ok.num_prefill_tokens) == (1, 4, 300)
    with pytest.raises(ValueError, match="row 1 verifies drafts but comes after"):
        sb.build(np.array([0, 300, 304]), np.array([300, 104]), table, 2,
                 drafts=np.array([-1, 3]))


@pytest.mark.parametrize("B", [64, 192, 576])
def test_fewest_columns_keep_every_span_apart(B):
    """With R = k + 1 columns (vLLM's spec_lookahead) the states after the k + 1 tokens of any
    span n + 1 .. n + k + 1 land in k + 1 different columns, every non-boundary one inside the
    private columns of a step that ends there ((N - 1) // B .. cdiv(N, B) + R - 1, N = n + k + 1);
    the read column of n is at or after the first of them, or a block column. Without the shift
    by the block index (column m // B + 1 + m % R) two states of a span crossing a boundary meet
    at this R, which is why it is there."""
    from gdn_graphs.vllm.builder import spec_lookahead

    def unshifted(m, R):
        return m // B - 1 if m % B == 0 else m // B + 1 + m % R

    for k in (1, 2, 3, 7, 15, 63):
        R = spec_lookahead(k)
        assert R == k + 1
        met = False
        for n in range(0, 4 * B):
            ms = range(n + 1, n + k + 2)
            cols = [lookahead_column(m, B, R) for m in ms]
            assert len(set(cols)) == k + 1, (k, n, cols)
            N = n + k + 1
            lo, hi = (N - 1) // B, -(-N // B) + R
            assert all(lo <= c < hi for m, c in zip(ms, cols) if m % B), (k, n, cols, lo, hi)
            if n:
                rc = lookahead_column(n, B, R)
                assert rc >= lo or n % B == 0, (k, n, rc, lo)
            met |= len({unshifted(m, R) for m in ms}) < k + 1
        assert met or k == 1, f"k={k}: the unshifted columns never met"
