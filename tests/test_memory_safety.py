"""Memory safety of every kernel, the error flag, and the one host-side slot validator (issue 14).

CPU tier (Triton interpreter), tiny shapes: HK 1, HV 2, K = V = 16, conv width 4 (C = 64), fp32.
Every kernel test puts the pools between NaN guard slots (helpers.guarded_pool: 8 before, and
after it enough for slot 1000 to land in one),
the token tensors inside larger NaN-filled buffers (a read outside a tensor would turn a result into
NaN) and the outputs inside buffers with sentinel rows around them, and checks: guards, sentinels
and every slot that must not be written bit-identical; outputs and written slots against the
float64 reference (gdn_graphs/ops/reference.py); and the error flag's code
(gdn_graphs.ops.common: ERR_SLOT 1, ERR_TOKENS 2, ERR_META 4).

    slots outside [-1, num_slots)     num_slots, 1000, 10**6, -2, -7 as read, write and checkpoint
                                      slots of every kernel: handled like -1, flag ERR_SLOT
    metadata beyond the tensors       host-built ChunkMeta: ValueError before any launch; device
                                      metadata (no host totals): spans clipped to the tensors,
                                      ERR_TOKENS; chunk / checkpoint tables outside their tables:
                                      skipped, ERR_META
    duplicates and conflicts          refused on the host by check_step_slots (planner and
                                      host_chunk_meta alike)

Hypothesis (seeded: derandomize), over random plans (1-3 rows, decode and prefill rows, block
sizes 64 and 128, n up to 2B + 3, checkpoints with NO_SLOT entries, token padding and decode
padding), each plan's device slot buffers then corrupted at up to three live entries with values
outside the pool:
    test_random_plans_planner_conv_decode   1,000 plans: the planner and the shared validator
        (a host-invalid variant of the plan, out of range / written twice / read-while-written,
        must be refused with the buffers intact), then every kernel but the chunk pair on the
        corrupted buffers (conv_decode, conv_prefill, gdn_decode on the decode rows), against
        the reference, guards, untouched slots and the planner's flag
    test_random_plans_full_core             64 plans through run_gdn_core (all five kernels)
The 1,000 do not run the chunk kernels: under the interpreter they cost ~0.3 s a plan.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.chunk import gdn_chunk_prefill
from gdn_graphs.ops.common import ERR_META, ERR_SLOT, ERR_TOKENS, error_names
from gdn_graphs.ops.conv import conv_decode, conv_prefill
from gdn_graphs.ops.decode import gdn_decode, gdn_decode_multi
from gdn_graphs.ops.meta import (ChunkMeta, check_step_slots, chunk_meta, host_chunk_meta,
                                 make_chunk_meta)
from gdn_graphs.ops.reference import causal_conv1d_ref, gdn_recurrent_ref
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import read_block, write_block
from helpers import (BEYOND, BEYOND_T, SENTINEL, Out, assert_only_slots_changed, beyond_meta,
                     decode_rows, guarded_pool, inside_nan, prefill_meta, prefill_rows, rel)
from helpers import guarded_workspace as _guarded_workspace
from helpers import ok as _ok

HK, HV, K, V, W = 1, 2, 16, 16, 4
C = 2 * HK * K + HV * V
NS = 12                                  # pool slots of the direct kernel tests
BAD = (NS, 1000, 10 ** 6, -2, -7)        # slot values outside [-1, NS)
# NaN guard slots before the pool and after it: slot 1000 (and -7) land in a guard, so a write
# there shows up as a changed guard; 10**6 lies far beyond (a crash, if anything).
G0 = 8
GUARDS = (G0, 1000 - NS + 4)
TOL = 1e-4                               # fp32 kernels against the float64 reference
f32 = torch.float32


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def ok(s: int, num_slots: int = NS) -> int:
    return _ok(s, num_slots)


def guarded_workspace(T):
    return _guarded_workspace(T, HV, K, V, f32, HK=HK)


def gdn_weights(seed=1):
    gen = torch.Generator().manual_seed(seed)
    conv_w = 0.5 * torch.randn(C, W, generator=gen)
    A_log = torch.rand(HV, generator=gen) * 2 - 1
    dt_bias = torch.randn(HV, generator=gen)
    return conv_w, A_log, dt_bias


def split(y):
    """q [T, HK, K], k, v [T, HV, V] from a packed [T, C] conv output (as run_gdn_core)."""
    return (y[:, :HK * K].unflatten(1, (HK, K)), y[:, HK * K:2 * HK * K].unflatten(1, (HK, K)),
            y[:, 2 * HK * K:].unflatten(1, (HV, V)))


def guards_for(num_slots):
    return (G0, 1000 - num_slots + 4)


def flag():
    return torch.zeros(1, dtype=torch.int32)


def pools(seed=0, num_slots=NS):
    """Guarded conv and state pools: (conv_buf, conv_pool, ssm_buf, ssm_pool)."""
    guards = guards_for(num_slots)
    cbuf, cpool = guarded_pool(num_slots, (C, W - 1), f32, "cpu", pad=2, seed=seed, guards=guards)
    sbuf, spool = guarded_pool(num_slots, (HV, V, K), f32, "cpu", pad=3, seed=seed + 1,
                               guards=guards)
    return cbuf, cpool, sbuf, spool


# --------------------------------------------------------------------------------------------
# the shared host validator and the host totals of ChunkMeta
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,msg", [
    (dict(write_slot=[10 ** 6, 2], num_slots=16),
     r"row 0: write slot = 1000000 is outside \[-1, 16\)"),
    (dict(write_slot=[1, 16], num_slots=16), r"row 1: write slot = 16 is outside \[-1, 16\)"),
    (dict(read_slot=[-2, 5]), r"row 0: read slot = -2 is outside \[-1, num_slots\)"),
    (dict(ckpt_slots=[[-5], []]), r"row 0: checkpoint slot 0 = -5 is outside"),
    (dict(write_slot=[3, 3]), r"row 1: writes slot 3, which row 0 also writes"),
    (dict(ckpt_slots=[[3], []], write_slot=[3, 2]), r"row 0: writes slot 3 twice in one step"),
    (dict(ckpt_slots=[[2], []]), r"row 1: writes slot 2, which row 0 also writes"),
    (dict(read_slot=[2, 5]), r"row 0: reads slot 2, which row 1 writes in the same step"),
])
def test_chunk_meta_refuses_bad_slots_with_the_planners_messages(kw, msg):
    args = dict(seqlens=[70, 10], start_pos=[0, 64], read_slot=[-1, 5], write_slot=[1, 2],
                ckpt_slots=[[4], []], block_size=64)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        chunk_meta(**args)
    lists = host_chunk_meta(**{k: v for k, v in args.items() if k != "num_slots"},
                            check_slots=False)  # a caller that validated already
    assert lists["write_slot"] == list(args["write_slot"])


def test_chunk_meta_accepts_legal_slots():
    # a row may read the slot it writes, and checkpoint into the block it resumes from
    meta = chunk_meta([70, 1], [10, 64], [3, 5], [3, 5], [[4], []], 64, num_slots=6)
    assert meta.write_slot.tolist() == [3, 5]


@pytest.mark.parametrize("ns,qs,tables,reads,writes,ckpts", [
    ([0, 0], [1, 1], [[1], [1]], [NO_SLOT, NO_SLOT], [1, 1], [[], []]),
    ([0, 0], [70, 70], [[1, 2], [2, 3]], [NO_SLOT, NO_SLOT], [2, 3], [[1], [2]]),
    ([0, 64], [1, 1], [[1], [1, 2]], [NO_SLOT, 1], [1, 2], [[], []]),
])
def test_one_validator_for_planner_and_chunk_meta(ns, qs, tables, reads, writes, ckpts):
    """The planner's checks are check_step_slots: the same rule and message for the same slots."""
    p = GDNPlanner(PlanLimits(4, 512, 64, 32, 8))
    with pytest.raises(ValueError) as planner_err:
        p.plan(ns, qs, tables)
    with pytest.raises(ValueError) as shared_err:
        check_step_slots(reads, writes, ckpts)
    assert str(planner_err.value) == str(shared_err.value)


def test_chunk_meta_carries_host_totals():
    meta = chunk_meta([40, 50], [0, 5], [-1, 1], [2, 3], [[], []], 64, max_seqs=4)
    assert (meta.num_seqs, meta.num_tokens) == (2, 90)
    assert "num_tokens" not in ChunkMeta.tensor_fields() and len(meta.tensors()) == 8
    assert all(isinstance(t, torch.Tensor) for t in meta.tensors())
    swapped = dataclasses.replace(meta, read_slot=meta.read_slot.clone())   # vLLM's SlotSet
    assert swapped.num_tokens == 90
    lists = host_chunk_meta([3], [0], [-1], [1], [[]], 64)
    assert make_chunk_meta("cpu", 64, **lists).num_tokens == 3
    p = GDNPlanner(PlanLimits(4, 512, 64, 32, 8))
    assert p.prefill.num_tokens is None and p.prefill.num_seqs is None


def test_launchers_refuse_host_meta_longer_than_the_tensors():
    """A ChunkMeta built on the host that covers more tokens than the tensors hold is refused
    before any launch: no pool, output or flag is touched."""
    conv_w, A_log, dt_bias = gdn_weights()
    cbuf, cpool, sbuf, spool = pools()
    cbuf0, sbuf0 = cbuf.clone(), sbuf.clone()
    meta = chunk_meta([40, 50], [0, 5], [-1, 1], [2, 3], [[], []], 64)
    T = 70
    x = inside_nan(T, C)
    q, k, v = split(x)
    a, b = inside_nan(T, HV, seed=1), inside_nan(T, HV, seed=2)
    out, y, fl = Out(T, HV, V), Out(T, C), flag()
    with pytest.raises(ValueError, match="gdn_chunk_prefill: meta covers 90 tokens, q holds 70"):
        gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, spool, meta, out=out.t, error_flag=fl)
    with pytest.raises(ValueError, match="conv_prefill: meta covers 90 tokens, x holds 70"):
        conv_prefill(x, conv_w, None, cpool, meta, out=y.t, error_flag=fl)
    assert_only_slots_changed(cbuf, cbuf0, (), GUARDS)
    assert_only_slots_changed(sbuf, sbuf0, (), GUARDS)
    assert (out.t == SENTINEL).all() and (y.t == SENTINEL).all() and fl.item() == 0


def test_error_flag_must_be_int32():
    conv_w, *_ = gdn_weights()
    _, cpool, _, _ = pools()
    slots = torch.tensor([-1], dtype=torch.int32)
    with pytest.raises(ValueError, match="error_flag must be an int32"):
        conv_decode(torch.randn(1, C), conv_w, None, cpool, slots, slots,
                    error_flag=torch.zeros(1))


def test_error_names():
    assert error_names(0) == []
    assert error_names(ERR_SLOT | ERR_META) == ["slot out of range",
                                                "chunk or checkpoint table inconsistent"]
    assert error_names(ERR_TOKENS) == ["tokens beyond the tensors"]
    assert error_names(8) == ["unknown code 8"]


# --------------------------------------------------------------------------------------------
# the planner's flag
# --------------------------------------------------------------------------------------------

def test_planner_owns_one_flag_zeroed_by_each_plan():
    p = GDNPlanner(PlanLimits(4, 512, 64, 32, 8))
    step = p.plan([5, 0], [1, 70], [[1], [2, 3]])
    assert step.error_flag is p.error_flag and p.template(4).error_flag is p.error_flag
    assert p.error_flag.dtype == torch.int32 and p.error_flag.numel() == 1
    flat = p.flat
    assert flat.data_ptr() <= p.error_flag.data_ptr() < flat.data_ptr() + flat.numel() * 4
    assert any(t is p.error_flag for t in p.buffers())
    assert p.read_errors() == 0
    p.error_flag.fill_(ERR_SLOT | ERR_TOKENS)
    assert p.read_errors() == 3
    assert p.error_names(3) == ["slot out of range", "tokens beyond the tensors"]
    p.plan([6], [1], [[1]])             # the flag is part of plan()'s one copy
    assert p.read_errors() == 0
    before = p.flat.clone()
    with pytest.raises(ValueError):
        p.plan([0], [1], [[40]])        # refused before any buffer is touched
    assert torch.equal(p.flat, before)


def test_core_reports_corrupted_device_slots_and_touches_nothing_else():
    """A step whose device slot buffers hold values outside the pool (e.g. a bad gather of an
    engine's block ids): every kernel skips them, the step's flag says ERR_SLOT, the next plan
    clears it."""
    conv_w, A_log, dt_bias = gdn_weights()
    cbuf, cpool, sbuf, spool = pools(seed=3)
    cbuf0, sbuf0 = cbuf.clone(), sbuf.clone()
    p = GDNPlanner(PlanLimits(4, 256, 64, NS, 8))
    step = p.plan([5, 0], [1, 70], [[1], [2, 3]])
    p.decode_write[0] = 10 ** 6        # the decode row stores nothing
    p.prefill.ckpt_slots[0] = -3       # the prefill row's checkpoint at 64: nothing
    p.prefill.write_slot[0] = NS       # ... nor its final state
    T = 74
    x = inside_nan(T, C, seed=4)
    a, b = inside_nan(T, HV, seed=5), inside_nan(T, HV, seed=6)
    out = Out(T, HV, V)
    run_gdn_core(x, a, b, GDNWeights(conv_w, None, A_log, dt_bias), GDNPools(cpool, spool), step,
                 out.t, guarded_workspace(T)[0])
    assert p.read_errors() == ERR_SLOT
    out.check()
    assert_only_slots_changed(cbuf, cbuf0, (), GUARDS, what="conv pool")
    assert_only_slots_changed(sbuf, sbuf0, (), GUARDS, what="state pool")
    assert torch.equal(out.t[71:], torch.zeros_like(out.t[71:])) and not out.t.isnan().any()
    p.plan([6], [1], [[1]])
    assert p.read_errors() == 0


# --------------------------------------------------------------------------------------------
# slots outside the pool, each kernel called directly
# --------------------------------------------------------------------------------------------

def _gdn_ref(q, k, v, a, b, A_log, dt_bias, init):
    return gdn_recurrent_ref(q, k, v, a, b, A_log, dt_bias, init, return_all_states=True)


class Gdn:
    """A GDN launch over T tokens: a guarded state pool (``buf``, ``pool``; ``pool0`` the
    contents before), inputs inside NaN rows, an output inside sentinel rows, a flag."""

    def __init__(self, T, seed):
        _, self.A_log, self.dt_bias = gdn_weights()
        _, _, self.buf, self.pool = pools(seed=seed)
        self.buf0 = self.buf.clone()
        self.pool0 = self.buf0[G0:G0 + NS, :HV * V * K].unflatten(1, (HV, V, K))
        self.q, self.k, self.v = split(inside_nan(T, C, seed=seed + 100))
        self.a, self.b = inside_nan(T, HV, seed=seed + 101), inside_nan(T, HV, seed=seed + 102)
        self.out, self.fl = Out(T, HV, V), flag()

    def inputs(self):
        """q, k, v, a, b, A_log, dt_bias, pool: the kernels' leading arguments."""
        return self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias, self.pool

    def ref(self, sl, r):
        """(outputs, final state, state after each token) of tokens ``sl`` from slot r (-1: 0)."""
        return _gdn_ref(self.q[sl], self.k[sl], self.v[sl], self.a[sl], self.b[sl], self.A_log,
                        self.dt_bias, self.pool0[r] if r >= 0 else None)

    def check_untouched(self, written):
        """Guard rows around out, and every slot but ``written``, unchanged."""
        self.out.check()
        assert_only_slots_changed(self.buf, self.buf0, written, GUARDS, state=HV * V * K)


class Conv:
    """A conv launch over T tokens: a guarded conv pool (``buf``, ``pool``; ``pool0`` the
    contents before), x inside NaN rows, an output y inside sentinel rows, a flag."""

    def __init__(self, T, seed):
        self.conv_w, _, _ = gdn_weights()
        self.buf, self.pool, _, _ = pools(seed=seed)
        self.buf0 = self.buf.clone()
        self.pool0 = self.buf0[G0:G0 + NS, :C * (W - 1)].unflatten(1, (C, W - 1))
        self.x = inside_nan(T, C, seed=seed + 100)
        self.y, self.fl = Out(T, C), flag()

    def ref(self, sl, r):
        """(outputs, final window, window after each token) of tokens ``sl`` from slot r."""
        return causal_conv1d_ref(self.x[sl], self.conv_w, None,
                                 self.pool0[r] if r >= 0 else None, return_all_windows=True)

    def check_untouched(self, written):
        self.y.check()
        assert_only_slots_changed(self.buf, self.buf0, written, GUARDS, state=C * (W - 1))


@pytest.mark.parametrize("bad", BAD)
def test_gdn_decode_bad_slots(bad):
    rows = decode_rows(bad)
    g = Gdn(len(rows), seed=bad % 97)
    rs = torch.tensor([r for r, _ in rows] + [bad], dtype=torch.int32)  # entries past N: unread
    ws = torch.tensor([w for _, w in rows] + [bad], dtype=torch.int32)
    gdn_decode(*g.inputs(), rs, ws, out=g.out.t, error_flag=g.fl)
    assert g.fl.item() == ERR_SLOT
    written = []
    for i, (r, w) in enumerate(rows):
        r, w = ok(r), ok(w)
        if r == w == NO_SLOT:
            assert torch.equal(g.out.t[i], torch.zeros_like(g.out.t[i])), f"row {i} is padding"
            continue
        o, S, _ = g.ref(slice(i, i + 1), r)
        assert rel(g.out.t[i], o[0]) < TOL, f"row {i}"
        if w >= 0:
            assert rel(g.pool[w], S) < TOL, f"row {i} state"
            written.append(w)
    g.check_untouched(written)
    # without a flag: the same memory behaviour
    g.buf.copy_(g.buf0)
    gdn_decode(*g.inputs(), rs, ws, out=g.out.t)
    g.check_untouched(written)


@pytest.mark.parametrize("bad", BAD)
def test_gdn_decode_multi_bad_slots(bad):
    # rows of 2, 1, 3 tokens and an empty one; per-token write slots with bad entries
    cu = [0, 2, 3, 6, 6]
    reads = [0, bad, 1, bad]
    wtab = [[2, bad, NO_SLOT], [bad, NO_SLOT, NO_SLOT], [bad, 3, 4], [bad, bad, NO_SLOT]]
    g = Gdn(cu[-1], seed=5)
    gdn_decode_multi(*g.inputs(), torch.tensor(cu, dtype=torch.int32),
                     torch.tensor(reads, dtype=torch.int32), torch.tensor(wtab, dtype=torch.int32),
                     out=g.out.t, error_flag=g.fl)
    assert g.fl.item() == ERR_SLOT
    written = []
    for i in range(len(cu) - 1):
        sl = slice(cu[i], cu[i + 1])
        if cu[i] == cu[i + 1]:
            continue
        o, _, states = g.ref(sl, ok(reads[i]))
        assert rel(g.out.t[sl], o) < TOL, f"row {i}"
        for t, w in enumerate(wtab[i][:cu[i + 1] - cu[i]]):
            if ok(w) >= 0:
                assert rel(g.pool[w], states[t]) < TOL, f"row {i} token {t}"
                written.append(w)
    g.check_untouched(written)


@pytest.mark.parametrize("bad", BAD)
def test_conv_decode_bad_slots(bad):
    rows = decode_rows(bad)
    c = Conv(len(rows), seed=6)
    conv_decode(c.x, c.conv_w, None, c.pool, torch.tensor([r for r, _ in rows], dtype=torch.int32),
                torch.tensor([w for _, w in rows], dtype=torch.int32), out=c.y.t, error_flag=c.fl)
    assert c.fl.item() == ERR_SLOT
    written = []
    for i, (r, w) in enumerate(rows):
        r, w = ok(r), ok(w)
        if r == w == NO_SLOT:
            assert torch.equal(c.y.t[i], torch.zeros_like(c.y.t[i]))
            continue
        ref, fin, _ = c.ref(slice(i, i + 1), r)
        assert rel(c.y.t[i], ref[0]) < TOL
        if w >= 0:
            assert torch.equal(c.pool[w], fin.to(f32)), f"row {i} window"
            written.append(w)
    c.check_untouched(written)


def _check_prefill_rows(rows, cu, B, got, ref_fn, pool, pool_cmp):
    """Per row: outputs vs ``ref_fn(sl, init_slot)`` -> (out, final, per-token states), the
    written final and checkpoint slots via ``pool_cmp``. Returns the slots written."""
    written = []
    for i, (n, q, r, w, ck) in enumerate(rows):
        sl = slice(cu[i], cu[i] + q)
        o, fin, states = ref_fn(sl, ok(r))
        assert rel(got[sl], o) < TOL, f"row {i}"
        for e, s in enumerate(ck):
            if ok(s) >= 0:
                pool_cmp(pool[s], states[(n // B + 1 + e) * B - n - 1], f"row {i} checkpoint {e}")
                written.append(s)
        if ok(w) >= 0:
            pool_cmp(pool[w], fin, f"row {i} final")
            written.append(w)
    return written


def _exact(got, want, what):
    assert torch.equal(got, want.to(got.dtype)), what


def _close(got, want, what):
    assert rel(got, want) < TOL, what


@pytest.mark.parametrize("bad", BAD)
def test_conv_prefill_bad_slots(bad):
    rows = prefill_rows(bad)
    meta = prefill_meta(rows)
    cu = meta.cu_seqlens.tolist()
    c = Conv(cu[-1] + 5, seed=7)   # 5 padding tokens
    conv_prefill(c.x, c.conv_w, None, c.pool, meta, out=c.y.t, error_flag=c.fl)
    assert c.fl.item() == ERR_SLOT
    written = _check_prefill_rows(rows, cu, 64, c.y.t, c.ref, c.pool, _exact)
    assert torch.equal(c.y.t[cu[-1]:], torch.zeros_like(c.y.t[cu[-1]:]))
    c.check_untouched(written)


@pytest.mark.parametrize("bad", BAD)
def test_chunk_prefill_bad_slots(bad):
    rows = prefill_rows(bad)
    meta = prefill_meta(rows)
    cu = meta.cu_seqlens.tolist()
    g = Gdn(cu[-1] + 5, seed=8)
    ws, ws_check = guarded_workspace(cu[-1] + 5)
    gdn_chunk_prefill(*g.inputs(), meta, out=g.out.t, workspace=ws, error_flag=g.fl)
    assert g.fl.item() == ERR_SLOT
    written = _check_prefill_rows(rows, cu, 64, g.out.t, g.ref, g.pool, _close)
    assert torch.equal(g.out.t[cu[-1]:], torch.zeros_like(g.out.t[cu[-1]:]))
    ws_check()
    g.check_untouched(written)


# --------------------------------------------------------------------------------------------
# metadata beyond the tensors (device metadata: no host totals)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fields,code,_", BEYOND, ids=[b[0] for b in BEYOND])
def test_conv_prefill_metadata_beyond_the_tensors(name, fields, code, _):
    c = Conv(BEYOND_T, seed=9)
    conv_prefill(c.x, c.conv_w, None, c.pool, beyond_meta(fields), out=c.y.t, error_flag=c.fl)
    assert c.fl.item() == code, error_names(c.fl.item())
    c.check_untouched(range(1, 7))
    assert not c.y.t.isnan().any(), "an output read from outside x"
    assert not c.pool[1:7].isnan().any(), "a window read from outside x"


@pytest.mark.parametrize("name,fields,_,code", BEYOND, ids=[b[0] for b in BEYOND])
def test_chunk_prefill_metadata_beyond_the_tensors(name, fields, _, code):
    g = Gdn(BEYOND_T, seed=10)
    ws, ws_check = guarded_workspace(BEYOND_T)
    gdn_chunk_prefill(*g.inputs(), beyond_meta(fields), out=g.out.t, workspace=ws,
                      error_flag=g.fl)
    assert g.fl.item() == code, error_names(g.fl.item())
    ws_check()
    g.check_untouched(range(1, 7))
    # (out rows no chunk covers keep their sentinel; a NaN means a read outside the tensors)
    assert not g.out.t.isnan().any(), "an output read from outside q, k, v, a, b"
    assert not g.pool[1:7].isnan().any(), "a state read from outside q, k, v, a, b"


def test_chunk_prefill_cu_past_T_clips_the_last_span():
    """cu_seqlens [0, 40, 90] over 70 tokens: row 0 exact, row 1 computed over its 30 tokens that
    exist (as a 30-token span), ERR_TOKENS; nothing outside the tensors read or written."""
    g = Gdn(BEYOND_T, seed=11)
    gdn_chunk_prefill(*g.inputs(), beyond_meta(dict(cu=[0, 40, 90])), out=g.out.t,
                      error_flag=g.fl)
    assert g.fl.item() == ERR_TOKENS
    for sl, r, w in ((slice(0, 40), NO_SLOT, 2), (slice(40, 70), 1, 3)):
        o, S, _ = g.ref(sl, r)
        assert rel(g.out.t[sl], o) < TOL and rel(g.pool[w], S) < TOL
    g.check_untouched((2, 3))


@pytest.mark.parametrize("cu", [[0, 2, 9], [0, 2, 10 ** 6], [0, -3, 2], [-2 ** 31, 1, 4],
                                [0, 3, 1]])
def test_gdn_decode_multi_tokens_beyond_the_tensors(cu):
    g = Gdn(4, seed=12)
    wt = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    gdn_decode_multi(*g.inputs(), torch.tensor(cu, dtype=torch.int32),
                     torch.tensor([7, 8], dtype=torch.int32), wt, out=g.out.t, error_flag=g.fl)
    assert g.fl.item() == ERR_TOKENS
    g.check_untouched(range(1, 7))
    assert not g.pool[1:7].isnan().any(), "a state computed from tokens outside the tensors"


# --------------------------------------------------------------------------------------------
# hypothesis: random plans with corrupted device slots
# --------------------------------------------------------------------------------------------

PLAN_SLOTS = 24
PLAN_BAD = (PLAN_SLOTS, PLAN_SLOTS + 5, 1000, 10 ** 6, -2, -7)
MAX_TOKENS = 160
_PLANNERS: dict[int, GDNPlanner] = {}


def planner_for(B: int) -> GDNPlanner:
    if B not in _PLANNERS:
        _PLANNERS[B] = GDNPlanner(PlanLimits(max_seqs=3, max_tokens=MAX_TOKENS, block_size=B,
                                             num_slots=PLAN_SLOTS, max_blocks_per_seq=8))
    return _PLANNERS[B]


@st.composite
def plan_cases(draw):
    B = draw(st.sampled_from([64, 128]))
    rows = draw(st.integers(1, 3))
    budget = MAX_TOKENS - 8
    ns, qs = [], []
    for i in range(rows):
        q = draw(st.one_of(st.just(1), st.just(1), st.integers(2, 100)))
        q = max(1, min(q, budget - (rows - i - 1)))
        budget -= q
        qs.append(q)
        ns.append(draw(st.integers(0, 2 * B + 3)))
    perm = draw(st.permutations(range(PLAN_SLOTS)))
    tables, used = [], 0
    for n, q in zip(ns, qs):
        width = write_block(n, q, B) + 1
        tables.append(list(perm[used:used + width]))
        used += width
    for i, (n, q) in enumerate(zip(ns, qs)):   # checkpoints that store nothing
        for c in range(n // B, write_block(n, q, B)):
            if c != read_block(n, B) and draw(st.integers(0, 4)) == 0:
                tables[i][c] = NO_SLOT
    return dict(
        B=B, ns=ns, qs=qs, tables=tables,
        pad_tokens=draw(st.integers(0, 5)),
        pad_decodes=draw(st.integers(0, 2)),
        corrupt=draw(st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from(PLAN_BAD)),
                              max_size=3)),
        host_bad=draw(st.sampled_from([None, None, "range", "dup", "conflict"])),
        host_bad_at=draw(st.integers(0, 10 ** 6)),
        seed=draw(st.integers(0, 2 ** 16)),
    )


def _host_invalid(case):
    """The case's tables made illegal in one way (or None when the plan has no room for it)."""
    ns, qs, B = case["ns"], case["qs"], case["B"]
    tables = [list(t) for t in case["tables"]]
    rows = len(ns)
    i = case["host_bad_at"] % rows
    last = write_block(ns[i], qs[i], B)
    if case["host_bad"] == "range":
        tables[i][last] = PLAN_BAD[case["host_bad_at"] % len(PLAN_BAD)]
        return tables
    if rows < 2:
        return None
    j = (i + 1) % rows
    if case["host_bad"] == "dup":       # row j's final state into row i's write slot
        tables[j][write_block(ns[j], qs[j], B)] = tables[i][last]
        return tables
    if ns[i] == 0:                      # "conflict": row j writes the slot row i reads
        return None
    tables[j][write_block(ns[j], qs[j], B)] = tables[i][read_block(ns[i], B)]
    return tables


def _plan(case):
    """Plan the case (checking that its host-invalid variant is refused first), corrupt the
    device slot buffers, and return (planner, step, rows, T, corrupted): rows as the kernels will
    see them, [(kind, n, q, read, write, ckpts, first token)]."""
    p = planner_for(case["B"])
    ns, qs = case["ns"], case["qs"]
    if case["host_bad"]:
        bad_tables = _host_invalid(case)
        if bad_tables is not None:
            before = p.flat.clone()
            with pytest.raises(ValueError, match=r"row \d+"):
                p.plan(ns, qs, bad_tables)
            assert torch.equal(p.flat, before)
    pure_decode = all(q == 1 for q in qs)
    pad = len(qs) + case["pad_decodes"] if pure_decode and case["pad_decodes"] else None
    if pad is not None and pad > p.limits.max_seqs:
        pad = None
    p.error_flag.fill_(ERR_META)        # a stale code: plan() must clear it
    step = p.plan(ns, qs, case["tables"], pad_decodes_to=pad)
    assert p.read_errors() == 0
    h = step.host
    d, nd = h.num_decodes, step.num_decodes
    dr = list(h.decode_read) + [NO_SLOT] * (nd - d)
    dw = list(h.decode_write) + [NO_SLOT] * (nd - d)
    pr, pw = list(h.prefill_read), list(h.prefill_write)
    pc = [list(c) for c in h.prefill_ckpts]
    ck_pos = [(j, e) for j, c in enumerate(pc) for e in range(len(c))]
    positions = ([("dr", i) for i in range(nd)] + [("dw", i) for i in range(nd)]
                 + [("pr", j) for j in range(len(pr))] + [("pw", j) for j in range(len(pw))]
                 + [("ck", e) for e in range(len(ck_pos))])
    corrupted = False
    for idx, val in case["corrupt"]:
        kind, i = positions[idx % len(positions)]
        corrupted = True
        if kind == "dr":
            p.decode_read[i], dr[i] = val, NO_SLOT
        elif kind == "dw":
            p.decode_write[i], dw[i] = val, NO_SLOT
        elif kind == "pr":
            p.prefill.read_slot[i], pr[i] = val, NO_SLOT
        elif kind == "pw":
            p.prefill.write_slot[i], pw[i] = val, NO_SLOT
        else:
            j, e = ck_pos[i]
            p.prefill.ckpt_slots[i], pc[j][e] = val, NO_SLOT
    rows, t = [], 0
    for i in range(nd):
        n = ns[i] if i < d else 0
        rows.append(("decode", n, 1, dr[i], dw[i], [], t))
        t += 1
    for j in range(len(pr)):
        n, q = ns[d + j], qs[d + j]
        rows.append(("prefill", n, q, pr[j], pw[j], pc[j], t))
        t += q
    return p, step, rows, t + case["pad_tokens"], corrupted


def _expect(rows, B, x, conv_w, cpool0, a, b, A_log, dt_bias, spool0, prefill_gdn=True):
    """Reference outputs per row and the expected writes: (y per row, out per row or None,
    {slot: window}, {slot: state})."""
    ys, outs, wins, states = [], [], {}, {}
    for kind, n, q, r, w, ck, t0 in rows:
        sl = slice(t0, t0 + q)
        if kind == "decode" and r == w == NO_SLOT:     # padding: zeros, nothing stored
            ys.append(torch.zeros(1, C, dtype=torch.float64))
            outs.append(torch.zeros(1, HV, V, dtype=torch.float64))
            continue
        y, fin, ws = causal_conv1d_ref(x[sl], conv_w, None, cpool0[r] if r >= 0 else None,
                                       return_all_windows=True)
        ys.append(y)
        run_gdn = kind == "decode" or prefill_gdn
        o = S = st_all = None
        if run_gdn:
            qq, kk, vv = split(y)
            o, S, st_all = _gdn_ref(qq, kk, vv, a[sl], b[sl], A_log, dt_bias,
                                    spool0[r] if r >= 0 else None)
        outs.append(o)
        for e, s in enumerate(ck):
            if s >= 0:
                p_e = (n // B + 1 + e) * B
                wins[s] = ws[p_e - n - 1]
                if run_gdn:
                    states[s] = st_all[p_e - n - 1]
        if w >= 0:
            wins[w] = fin
            if run_gdn:
                states[w] = S
    return ys, outs, wins, states


def _inputs(T, seed):
    x = inside_nan(T, C, seed=seed)
    a, b = inside_nan(T, HV, seed=seed + 1), inside_nan(T, HV, seed=seed + 2)
    return x, a, b


_HYP = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _random_plan(case, full: bool):
    """Plan ``case`` (with its host-invalid variant refused), corrupt its device slots, run the
    kernels and check them: with ``full`` run_gdn_core (all five kernels), else the GDN core
    without its chunk kernels (conv_decode + gdn_decode on the decode rows, conv_prefill on the
    prefill rows; gdn_decode with BV = V, one program per head: cheap under the interpreter)."""
    p, step, rows, T, corrupted = _plan(case)
    conv_w, A_log, dt_bias = gdn_weights(case["seed"] % 7)
    cbuf, cpool, sbuf, spool = pools(seed=case["seed"], num_slots=PLAN_SLOTS)
    cbuf0, sbuf0 = cbuf.clone(), sbuf.clone()
    cpool0 = cbuf0[G0:G0 + PLAN_SLOTS, :C * (W - 1)].unflatten(1, (C, W - 1))
    spool0 = sbuf0[G0:G0 + PLAN_SLOTS, :HV * V * K].unflatten(1, (HV, V, K))
    x, a, b = _inputs(T, case["seed"])
    y, out = Out(T, C), Out(T, HV, V)
    nd, npre, fl = step.num_decodes, step.num_prefill_tokens, step.error_flag
    if full:
        ws, ws_check = guarded_workspace(MAX_TOKENS)
        run_gdn_core(x, a, b, GDNWeights(conv_w, None, A_log, dt_bias), GDNPools(cpool, spool),
                     step, out.t, ws)
        ws_check()
    else:
        if nd:
            conv_decode(x[:nd], conv_w, None, cpool, step.decode_read[:nd],
                        step.decode_write[:nd], out=y.t[:nd], error_flag=fl)
            qq, kk, vv = split(y.t[:nd])
            gdn_decode(qq, kk, vv, a[:nd], b[:nd], A_log, dt_bias, spool, step.decode_read[:nd],
                       step.decode_write[:nd], out=out.t[:nd], error_flag=fl, BV=V)
        if npre:
            conv_prefill(x[nd:nd + npre], conv_w, None, cpool, step.prefill,
                         out=y.t[nd:nd + npre], error_flag=fl)
    assert p.read_errors() == (ERR_SLOT if corrupted else 0)

    # (without ``full``, states holds the decode rows' writes only: nothing else writes the pool)
    ys, outs, wins, states = _expect(rows, case["B"], x, conv_w, cpool0, a, b, A_log, dt_bias,
                                     spool0, prefill_gdn=full)
    end = 0
    for (kind, n, q, *_rest, t0), yr, o in zip(rows, ys, outs):
        sl = slice(t0, t0 + q)
        end = t0 + q
        if not full:
            assert rel(y.t[sl], yr) < TOL, (kind, n, q)
        if o is not None:
            assert rel(out.t[sl], o) < TOL, (kind, n, q)
    if full:
        assert torch.equal(out.t[end:], torch.zeros_like(out.t[end:])), "padding tokens"
    for s, win in wins.items():
        assert torch.equal(cpool[s], win.to(f32)), f"window in slot {s}"
    for s, S in states.items():
        assert rel(spool[s], S) < TOL, f"state in slot {s}"
    y.check()
    out.check()
    g = guards_for(PLAN_SLOTS)
    assert_only_slots_changed(cbuf, cbuf0, wins, g, state=C * (W - 1), what="conv pool")
    assert_only_slots_changed(sbuf, sbuf0, states, g, state=HV * V * K, what="state pool")


@settings(max_examples=1000, **_HYP)
@given(plan_cases())
def test_random_plans_planner_conv_decode(case):
    _random_plan(case, full=False)


@settings(max_examples=64, **_HYP)
@given(plan_cases())
def test_random_plans_full_core(case):
    _random_plan(case, full=True)
