"""gdn_fi_prefill (FlashInfer's chunk prefill inside our contract) and its Triton kernels (the
engine routing and the sm90 compile: tests/test_fi_core.py).

CPU tier: the prep, gather and scatter kernels against torch under the interpreter (bad slots,
guard slots, -1 and clipped tables), and the whole orchestration with tests/fi_standin.py (a torch
chunk_gated_delta_rule with FlashInfer's contract) injected where FlashInfer runs: outputs and
every block state vs the fp64 reference, the rest of the pool untouched, warm == cold bit for bit,
and a broken stand-in caught. GPU tier (``-m gpu``, SM90 with FlashInfer; skipped with the reason
otherwise): the same against the real kernel and our gdn_chunk_prefill.
"""

from __future__ import annotations

import random

import pytest
import torch

import fi_standin
from gdn_graphs.ops.chunk import gdn_chunk_prefill
from gdn_graphs.ops.common import ERR_META, ERR_SLOT, ERR_TOKENS
from gdn_graphs.ops.fi_kernels import fi_gather, fi_prep, fi_scatter
from gdn_graphs.ops.fi_prefill import (FiWorkspace, fi_capture, fi_every, fi_intervals, fi_unsupported,
                                      gdn_fi_prefill, load_fi)
from gdn_graphs.ops.meta import chunk_meta, make_chunk_meta
from gdn_graphs.ops.reference import gdn_gating, l2norm
from helpers import assert_bits_equal, assert_only_slots_changed, guarded_pool, rel
from test_chunk import check_batch, make_inputs, plan

BF = torch.bfloat16
TOL = 1.5e-2  # bf16 inputs (test_chunk's bound)


def _flag(device):
    return torch.zeros(1, dtype=torch.int32, device=device)


def _ws(T, ns, HK, HV, K, V, device, n_ck=None):
    return FiWorkspace(T, ns, HK, HV, K, V, BF, device, max_checkpoints=n_ck or max(1, T // 64))


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------

def test_prep_matches_torch(device):
    HK, HV, K, V, T = 2, 4, 32, 32, 150
    q, k, v, a, b, A_log, dt_bias = make_inputs(T, HK, HV, K, V, BF, device, seed=3)
    seqs = [40, 1, 70]  # 111 live tokens, 39 padding rows
    meta = chunk_meta(seqs, [0, 64, 128], [-1] * 3, [-1] * 3, [[], [], []], 128, device=device)
    ws = _ws(T, 4, HK, HV, K, V, device)
    out = torch.full((T, HV, V), float("nan"), dtype=BF, device=device)
    flag = _flag(device)
    fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, 3, 64, flag, interpret=device == "cpu")
    live = sum(seqs)
    torch.testing.assert_close(ws.q[:live], l2norm(q[:live].float()).to(BF), atol=0, rtol=8e-3)
    torch.testing.assert_close(ws.k[:live], l2norm(k[:live].float()).to(BF), atol=0, rtol=8e-3)
    assert_bits_equal(ws.v[:live], v[:live].contiguous(), "v")
    g = gdn_gating(A_log, a[:live], dt_bias, torch.float32)
    torch.testing.assert_close(ws.alpha[:live], torch.exp(g), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ws.beta[:live], torch.sigmoid(b[:live].float()), rtol=1e-5, atol=1e-6)
    # padding rows: zero out / q / k / v, alpha 1, beta 0 (finite, no state change)
    for t in (out, ws.q, ws.k, ws.v, ws.beta):
        assert torch.equal(t[live:T], torch.zeros_like(t[live:T]))
    assert torch.equal(ws.alpha[live:T], torch.ones_like(ws.alpha[live:T]))
    assert torch.isnan(out[:live].float()).all(), "live rows are FlashInfer's to write"
    assert ws.cu64[:4].tolist() == [0, 40, 41, 111]
    assert ws.ckcu[:4].tolist() == [0, 0, 0, 1]  # 40 // 64, 1 // 64, 70 // 64
    assert flag.item() == 0


def test_prep_clips_bad_tables(device):
    HK, HV, K, V, T = 1, 2, 32, 32, 64
    inputs = make_inputs(T, HK, HV, K, V, BF, device)
    ws = _ws(T, 4, HK, HV, K, V, device)
    out = torch.empty(T, HV, V, dtype=BF, device=device)

    def go(cu, num_seqs):
        meta = make_chunk_meta(device, 64, cu_seqlens=cu, start_pos=[0] * 3, read_slot=[-1] * 3,
                               write_slot=[-1] * 3, ckpt_offsets=[0] * 4, ckpt_slots=[-1],
                               chunk_seq=[-1], chunk_idx=[-1])
        flag = _flag(device)
        fi_prep(*inputs, out, ws, meta, num_seqs, 64, flag, interpret=device == "cpu")
        return ws.cu64[:num_seqs + 1].tolist(), flag.item()

    assert go([0, 30, 20, 90], 3) == ([0, 30, 30, 64], ERR_TOKENS)  # decreasing, past T
    assert go([-5, 10, 20, 20], 3) == ([0, 10, 20, 20], ERR_TOKENS)
    assert go([0, 10, 20, 30], 2) == ([0, 10, 20], ERR_META)  # a live span past num_seqs
    assert go([0, 10, 20, 20], 2) == ([0, 10, 20], 0)


def test_gather_reads_slots_masked(device):
    HV, V, K, num_slots = 2, 16, 16, 5
    buf, pool = guarded_pool(num_slots, (HV, V, K), torch.float32, device, pad=3, guards=(1, 1000))
    buf0 = buf.clone()
    ws = FiWorkspace(8, 6, 1, HV, K, V, BF, device)
    ws.h0.fill_(float("nan"))
    reads = [3, -1, 0, 5, -7, 1000]
    meta = make_chunk_meta(device, 64, cu_seqlens=list(range(7)), start_pos=[0] * 6, read_slot=reads,
                           write_slot=[-1] * 6, ckpt_offsets=[0] * 7, ckpt_slots=[-1],
                           chunk_seq=[-1], chunk_idx=[-1])
    flag = _flag(device)
    fi_gather(pool, ws, meta, 6, flag)
    for i, s in enumerate(reads):
        want = pool[s] if 0 <= s < num_slots else torch.zeros_like(pool[0])
        assert_bits_equal(ws.h0[i], want, f"row {i}")
    assert flag.item() == ERR_SLOT
    assert_only_slots_changed(buf, buf0, guards=(1, 1000))


def _scatter_case(device, starts, lens, B, every, ckpt_slots, writes, offsets=None, num_slots=40):
    """Run fi_scatter on a guarded pool with FlashInfer checkpoint c = the constant c + 1 and
    final state i = -(i + 1); returns (pool buffer, copy before, pool, flag, ckcu list)."""
    HV, V, K = 2, 16, 16
    buf, pool = guarded_pool(num_slots, (HV, V, K), torch.float32, device, pad=5, guards=(1, 1000))
    buf0 = buf.clone()
    ns = len(lens)
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    if offsets is None:
        offsets = [0]
        for row in ckpt_slots:
            offsets.append(offsets[-1] + len(row))
    flat = [s for row in ckpt_slots for s in row] or [-1]
    meta = make_chunk_meta(device, B, cu_seqlens=cu, start_pos=starts, read_slot=[-1] * ns,
                           write_slot=writes, ckpt_offsets=offsets, ckpt_slots=flat,
                           chunk_seq=[-1], chunk_idx=[-1])
    T = cu[-1]
    ws = FiWorkspace(T, ns, 1, HV, K, V, BF, device, max_checkpoints=T // every)
    ckcu = [0]
    for L in lens:
        ckcu.append(ckcu[-1] + L // every)
    ws.cu64[:ns + 1] = torch.tensor(cu)
    ws.ckcu[:ns + 1] = torch.tensor(ckcu)
    for c in range(T // every):
        ws.ckpt[c] = c + 1.0
    for i in range(ns):
        ws.h0[i] = -(i + 1.0)
    flag = _flag(device)
    fi_scatter(pool, ws, meta, ns, T // every, every, flag)
    return buf, buf0, pool, flag.item(), ckcu


@pytest.mark.parametrize("starts,lens,B,every", [
    ([0, 256, 512], [600, 256, 300], 256, 256),     # block-aligned starts: every = B
    ([64, 0, 192], [400, 129, 320], 256, 64),       # starts inside blocks: every 64
    ([128, 384], [500, 700], 256, 128),             # every 128 divides all starts
])
def test_scatter_lands_block_states(device, starts, lens, B, every):
    rng = random.Random(5)
    slots = list(range(40))
    rng.shuffle(slots)
    ckpts = [[slots.pop() for _ in range((n + L - 1) // B - n // B)] for n, L in zip(starts, lens)]
    ckpts[0][0] = -1  # a -1 entry stores nothing
    writes = [slots.pop() for _ in lens]
    buf, buf0, pool, flag, ckcu = _scatter_case(device, starts, lens, B, every, ckpts, writes)
    assert flag == 0
    written = set(writes)
    for i, (n, row) in enumerate(zip(starts, ckpts)):
        assert torch.equal(pool[writes[i]], torch.full_like(pool[0], -(i + 1.0)))
        for e, s in enumerate(row):
            if s < 0:
                continue
            p = (n // B + 1 + e) * B  # our entry e: the state after p tokens
            c = ckcu[i] + (p - n) // every - 1  # FlashInfer's row of that state
            assert torch.equal(pool[s], torch.full_like(pool[0], c + 1.0)), (i, e, s, c)
            written.add(s)
    assert_only_slots_changed(buf, buf0, written, guards=(1, 1000), state=pool[0].numel())


def test_scatter_masks_bad_slots_and_tables(device):
    B = every = 64
    # seq 0: checkpoint slots 40 (outside the pool) and -3; write slot 1000 -> ERR_SLOT, nothing stored
    buf, buf0, pool, flag, _ = _scatter_case(device, [0], [200], B, every, [[40, -3, 7]], [1000])
    assert flag == ERR_SLOT
    assert torch.equal(pool[7], torch.full_like(pool[0], 3.0))
    assert_only_slots_changed(buf, buf0, {7}, guards=(1, 1000))
    # offsets outside the table: clipped, ERR_META; entries past the table store nothing
    buf, buf0, pool, flag, _ = _scatter_case(device, [0], [200], B, every, [[5, 6, 7]], [9],
                                             offsets=[1, 3])
    assert flag == ERR_META
    assert torch.equal(pool[6], torch.full_like(pool[0], 1.0))  # entry 1 = boundary 64
    assert torch.equal(pool[7], torch.full_like(pool[0], 2.0))
    assert_only_slots_changed(buf, buf0, {6, 7, 9}, guards=(1, 1000))
    # a start that is not a multiple of every: no checkpoint (none is on a boundary), ERR_META;
    # the final state is still stored
    buf, buf0, pool, flag, _ = _scatter_case(device, [64], [300], 128, 128, [[3, 4]], [5])
    assert flag == ERR_META
    assert torch.equal(pool[5], torch.full_like(pool[0], -1.0))
    assert_only_slots_changed(buf, buf0, {5}, guards=(1, 1000))


def test_fi_every():
    assert fi_every(256, [0, 512, 1024]) == 256
    assert fi_every(1024, [960]) == 64
    assert fi_every(1024, [0, 512]) == 512
    assert fi_every(256, [100]) is None  # not a 64-multiple: no aligned FlashInfer chunks


# ---------------------------------------------------------------------------------------------
# orchestration with the stand-in
# ---------------------------------------------------------------------------------------------

DIMS = (1, 2, 32, 32)  # HK, HV, K, V of the CPU tier


def _run_fi(seqs, B, reads, writes, ckpts, inputs, pool, dims, every=None, pad=0, fi_fn=None,
            flag=None):
    q, k, v, a, b, A_log, dt_bias = inputs
    T = sum(L for L, _ in seqs) + pad
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B,
                      device=pool.device, max_seqs=len(seqs) + 1)  # a padded row too
    ws = _ws(T, len(seqs) + 1, *dims, pool.device)
    out = torch.empty(T, dims[1], dims[3], dtype=BF, device=pool.device)
    gdn_fi_prefill(q[:T], k[:T], v[:T], a[:T], b[:T], A_log, dt_bias, pool, meta, out, ws,
                   every=every, fi_fn=fi_fn or fi_standin.chunk_gated_delta_rule, error_flag=flag)
    return out


def _batch(device, B, seqs, fi_fn=None, seed=0, dims=DIMS):
    """One step of ``seqs`` ((length, start) each) through gdn_fi_prefill, checked against the
    fp64 reference (outputs, every written slot, padding rows, the rest of the pool and its
    guards); returns what a caller compares further."""
    HK, HV, K, V = dims
    rng = random.Random(seed)
    inputs = make_inputs(sum(L for L, _ in seqs) + 7, HK, HV, K, V, BF, device, seed=seed)
    reads, writes, ckpts = plan(seqs, B, 48, rng)
    buf, pool = guarded_pool(48, (HV, V, K), torch.float32, device, pad=3, guards=(1, 1000))
    pool.mul_(0.3)
    buf0 = buf.clone()
    before = pool.clone()
    every = fi_every(B, [n for _, n in seqs])
    flag = _flag(device)
    out = _run_fi(seqs, B, reads, writes, ckpts, inputs, pool, dims, every=every, pad=7, fi_fn=fi_fn,
                 flag=flag)
    assert flag.item() == 0
    check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, pool, TOL)
    written = set(writes) | {s for row in ckpts for s in row if s >= 0}
    assert_only_slots_changed(buf, buf0, written, guards=(1, 1000), state=pool[0].numel())
    return inputs, out, (reads, writes, ckpts), before, pool


@pytest.mark.parametrize("B,seqs", [
    (128, [(300, 0), (128, 256), (1, 128), (200, 384)]),   # block-aligned: every = B
    (128, [(250, 64), (70, 0), (192, 192)]),               # 64-multiples inside blocks: every 64
])
def test_fi_prefill_vs_reference_standin(device, B, seqs):
    inputs, out, (reads, writes, ckpts), before, pool = _batch(device, B, seqs)
    # and close to our kernel on the same step
    pool2 = before.clone()
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, device=device)
    T = sum(L for L, _ in seqs)
    q, k, v, a, b, A_log, dt_bias = (x[:T] if x.dim() > 1 else x for x in inputs)
    ours = gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, pool2, meta)
    assert rel(out[:T], ours) < TOL


def test_broken_fi_is_caught(device):
    """A FlashInfer whose checkpoints land one row off must fail the checks above."""
    def broken(*args, **kw):
        return fi_standin.chunk_gated_delta_rule(*args, ckpt_shift=1, **kw)

    with pytest.raises(AssertionError):
        _batch(device, 64, [(300, 0), (200, 128)], fi_fn=broken)


def _warm_cold(device, fi_fn, L=512, B=256, cut=192, dims=DIMS, ws=None):
    """Cold: [0, L) in one step (checkpoint at B, ...). Warm: [B, L) from the checkpoint slot at B.
    Two-step: [0, cut) then [cut, L) from its write slot (cut a 64-multiple inside block 0: the
    second step runs with every = fi_every(B, [cut]) < B). Each must repeat the cold run's outputs
    and later states bit for bit. ``ws``: one workspace for every step (default: an exact-size one
    per step)."""
    HK, HV, K, V = dims
    inputs = make_inputs(L, HK, HV, K, V, BF, device, seed=11)
    pool = torch.zeros(16, HV, V, K, device=device)
    nck = L // B - (L % B == 0)
    ck_cold = list(range(1, 1 + nck))
    kw = dict(fi_fn=fi_fn)

    def step(n, q_len, read, write, ckpts, every=None):
        sl = slice(n, n + q_len)
        q, k, v, a, b = (x[sl] for x in inputs[:5])
        meta = chunk_meta([q_len], [n], [read], [write], [ckpts], B, device=device)
        w = ws or FiWorkspace(q_len, 1, HK, HV, K, V, BF, device, max_checkpoints=max(1, q_len // 64))
        out = torch.empty(q_len, HV, V, dtype=BF, device=device)
        flag = _flag(device)
        gdn_fi_prefill(q, k, v, a, b, inputs[5], inputs[6], pool, meta, out, w, every=every,
                       error_flag=flag, **kw)
        assert flag.item() == 0
        return out

    cold = step(0, L, -1, 0, ck_cold)
    warm = step(B, L - B, ck_cold[0], 10, ck_cold[1:] and [11 + e for e in range(nck - 1)])
    assert_bits_equal(warm, cold[B:], "warm outputs")
    assert_bits_equal(pool[10], pool[0], "warm final state")
    for e in range(nck - 1):
        assert_bits_equal(pool[11 + e], pool[ck_cold[1 + e]], f"warm checkpoint {e}")
    step(0, cut, -1, 12, [])
    two = step(cut, L - cut, 12, 13, [14 + e for e in range(nck)], every=fi_every(B, [cut]))
    assert_bits_equal(two, cold[cut:], "two-step outputs")
    assert_bits_equal(pool[13], pool[0], "two-step final state")
    for e in range(nck):
        assert_bits_equal(pool[14 + e], pool[ck_cold[e]], f"two-step checkpoint {e}")


def test_fi_warm_equals_cold_standin(device):
    _warm_cold(device, fi_standin.chunk_gated_delta_rule)


def test_fi_larger_workspace_with_leftovers_keeps_the_bits(device):
    """The call runs over the whole workspace: one twice the step's size, full of an earlier
    call's leftovers, gives what an exact-size one gives (stand-in; the GPU tier: the kernel)."""
    _same_bits_across_workspaces(device, fi_standin.chunk_gated_delta_rule, dims=DIMS, graphs=False)


def test_fi_intervals():
    assert fi_intervals(256) == [64, 128, 256]
    assert fi_intervals(576) == [64, 192, 576]
    assert fi_intervals(1088) == [64, 1088]
    assert all(fi_every(1024, [n]) in fi_intervals(1024) for n in range(0, 4096, 64))


_STEPS = [  # (block size, (length, start) rows): several rows and intervals, then one row
    (256, [(300, 0), (128, 256), (1, 128), (640, 384)]),
    (256, [(500, 64), (70, 0), (192, 192), (1000, 0)]),
    (256, [(1024, 0)]),
]


def _step_with(ws, B, seqs, fi_fn, seed):
    """One step of ``seqs`` through gdn_fi_prefill on ``ws``: (out, pool), from a seeded pool."""
    HK, HV, K, V = ws.HK, ws.HV, ws.K, ws.V
    dev = ws.device
    T = sum(L for L, _ in seqs)
    inputs = make_inputs(T, HK, HV, K, V, BF, dev, seed=seed)
    reads, writes, ckpts = plan(seqs, B, 48, random.Random(seed))
    pool = torch.randn(48, HV, V, K, device=dev, generator=torch.Generator(dev).manual_seed(seed)) * 0.3
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B,
                      device=dev, max_seqs=len(seqs) + 1)
    out = torch.empty(T, HV, V, dtype=BF, device=dev)
    flag = _flag(dev)
    gdn_fi_prefill(*inputs[:5], inputs[5], inputs[6], pool, meta, out, ws,
                   every=fi_every(B, [n for _, n in seqs]), fi_fn=fi_fn, error_flag=flag)
    assert flag.item() == 0
    return out, pool


def _leftovers(ws, seed=5):
    """Fill every buffer of ``ws`` with finite noise: what earlier calls may leave there."""
    gen = torch.Generator(ws.device).manual_seed(seed)
    for t in (ws.q, ws.k, ws.v, ws.out, ws.alpha, ws.beta, ws.h0, ws.ckpt):
        t.copy_(torch.randn(t.shape, generator=gen, device=ws.device))


def _same_bits_across_workspaces(device, fi_fn, dims, graphs):
    HK, HV, K, V = dims
    T_max = max(sum(L for L, _ in seqs) for _, seqs in _STEPS)

    def make(n):
        return FiWorkspace(n, 4, HK, HV, K, V, BF, device, max_checkpoints=n // 64)

    big = make(2 * T_max)
    if graphs:
        assert fi_capture(big, 256) == 4 * len(fi_intervals(256))
    _leftovers(big)
    for i, (B, seqs) in enumerate(_STEPS + _STEPS[:1]):  # re-planned, replayed again
        exact = make(sum(L for L, _ in seqs))
        o1, p1 = _step_with(exact, B, seqs, fi_fn, seed=i % len(_STEPS))
        o2, p2 = _step_with(big, B, seqs, fi_fn, seed=i % len(_STEPS))
        assert_bits_equal(o2, o1, f"step {i} outputs")
        assert_bits_equal(p2, p1, f"step {i} pool")
    n = len(_STEPS) + 1
    assert big.calls == ({"graph": n, "eager": 0} if graphs else {"graph": 0, "eager": n})


def _grouped_same_bits(device, fi_fn, dims, graphs=False):
    """A step of more sequences than the workspace's max_seqs (run in groups, one FlashInfer call
    each) gives, bit for bit, what one call over a workspace that holds them all gives: outputs,
    padding rows, every pool slot. Workspaces full of leftovers; rows of 1, 2 and 3 groups."""
    HK, HV, K, V = dims
    B = 256
    seqs = [(300, 0), (128, 256), (1, 128), (640, 384), (70, 0), (192, 512), (1, 0)]
    T = sum(L for L, _ in seqs)
    inputs = make_inputs(T + 9, HK, HV, K, V, BF, device, seed=4)
    reads, writes, ckpts = plan(seqs, B, 48, random.Random(4))
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B,
                      device=device, max_seqs=len(seqs) + 1)
    pool0 = torch.randn(48, HV, V, K, device=device,
                        generator=torch.Generator(device).manual_seed(4)) * 0.3
    results = {}
    for max_seqs in (len(seqs), 3, 2):  # one group; 3 groups (3, 3, 1); 4 groups (2, 2, 2, 1)
        ws = FiWorkspace(T + 9, max_seqs, HK, HV, K, V, BF, device, max_checkpoints=(T + 9) // 64)
        if graphs:
            fi_capture(ws, B)
        _leftovers(ws, seed=max_seqs)
        pool = pool0.clone()
        out = torch.full((T + 9, HV, V), float("nan"), dtype=BF, device=device)
        flag = _flag(device)
        gdn_fi_prefill(*(x[:T + 9] for x in inputs[:5]), inputs[5], inputs[6], pool, meta, out, ws,
                       every=fi_every(B, [n for _, n in seqs]), fi_fn=fi_fn, error_flag=flag)
        assert flag.item() == 0
        n_groups = -(-len(seqs) // max_seqs)
        assert ws.calls == ({"graph": n_groups, "eager": 0} if graphs else {"graph": 0, "eager": n_groups})
        results[max_seqs] = (out, pool)
    o1, p1 = results[len(seqs)]
    assert torch.equal(o1[T:], torch.zeros_like(o1[T:])), "padding rows"
    for max_seqs in (3, 2):
        assert_bits_equal(results[max_seqs][0], o1, f"outputs, groups of {max_seqs}")
        assert_bits_equal(results[max_seqs][1], p1, f"pool, groups of {max_seqs}")
    return inputs, meta, (reads, writes, ckpts), seqs, pool0, o1, p1


def test_fi_groups_keep_the_bits(device):
    inputs, meta, (reads, writes, ckpts), seqs, before, out, pool = _grouped_same_bits(
        device, fi_standin.chunk_gated_delta_rule, DIMS)
    # and the one-group call is right (so the grouped ones are too)
    check_batch(seqs, 256, reads, writes, ckpts, inputs, out, before, pool, TOL)


def test_bad_arguments_raise(device):
    HK, HV, K, V, T = 1, 2, 32, 32, 64
    q, k, v, a, b, A_log, dt_bias = make_inputs(T, HK, HV, K, V, BF, device)
    meta = chunk_meta([T], [0], [-1], [0], [[]], 64, device=device)
    pool = torch.zeros(2, HV, V, K, device=device)
    ws = _ws(T, 1, HK, HV, K, V, device)
    out = torch.empty(T, HV, V, dtype=BF, device=device)
    go = lambda **kw: gdn_fi_prefill(q, k, v, a, b, A_log, dt_bias, kw.pop("pool", pool), meta,  # noqa: E731
                                     kw.pop("out", out), kw.pop("ws", ws),
                                     fi_fn=fi_standin.chunk_gated_delta_rule, **kw)
    with pytest.raises(ValueError, match="fp32"):
        go(pool=pool.to(BF))
    with pytest.raises(ValueError, match="contiguous"):
        go(out=torch.empty(T, V, HV, dtype=BF, device=device).transpose(1, 2))
    with pytest.raises(ValueError, match="workspace holds"):
        go(ws=_ws(T - 1, 1, HK, HV, K, V, device))
    with pytest.raises(ValueError, match="every"):
        go(every=96)
    with pytest.raises(ValueError, match="num_seqs"):
        go(num_seqs=2, ws=_ws(T, 2, HK, HV, K, V, device))
    with pytest.raises(ValueError, match="out is required"):
        go(out=None)
    if not torch.cuda.is_available():
        assert fi_unsupported(q, v, pool) is not None


# ---------------------------------------------------------------------------------------------
# GPU tier: the real FlashInfer
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def fi_gpu(gpu):
    fn, why = load_fi()
    if fn is None:
        pytest.skip(f"FlashInfer not importable, FI path not tested: {why}")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashInfer's prefill path runs on SM90 only: FI path not tested")
    return fn


@pytest.mark.gpu
@pytest.mark.parametrize("B,seqs", [
    (128, [(300, 0), (128, 256), (1, 128), (640, 384)]),
    (256, [(500, 64), (70, 0), (192, 192), (1000, 0)]),
])
def test_gpu_fi_vs_ours_and_reference(fi_gpu, B, seqs):
    """Real FlashInfer: outputs and every block state vs fp64 and vs gdn_chunk_prefill (bf16
    tolerance), slots outside the plan untouched."""
    inputs, out, (reads, writes, ckpts), before, pool = _batch("cuda", B, seqs, fi_fn=fi_gpu,
                                                                dims=(2, 4, 128, 128))
    pool2 = before.clone()
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, device="cuda")
    T = sum(L for L, _ in seqs)
    q, k, v, a, b, A_log, dt_bias = (x[:T] if x.dim() > 1 else x for x in inputs)
    ours = gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, pool2, meta)
    assert rel(out[:T], ours) < TOL
    for s in set(writes) | {s for row in ckpts for s in row if s >= 0}:
        assert rel(pool[s], pool2[s]) < TOL, s


@pytest.mark.gpu
def test_gpu_fi_warm_equals_cold(fi_gpu):
    """Real FlashInfer, 2048 tokens, B = 1024: warm from the slot at 1024 and two steps cut at 960
    (every 64) repeat the cold run bit for bit."""
    _warm_cold("cuda", fi_gpu, L=2048, B=1024, cut=960, dims=(2, 4, 128, 128))


@pytest.mark.gpu
def test_gpu_fi_graphs_and_workspace_size_keep_the_bits(fi_gpu):
    """Real FlashInfer: steps through a workspace twice their size, full of leftovers, whose
    FlashInfer call replays fi_capture's graphs (captured once, the steps re-planned and replayed
    again), give what an exact-size workspace gives eagerly, bit for bit."""
    _same_bits_across_workspaces("cuda", fi_gpu, dims=(2, 4, 128, 128), graphs=True)


@pytest.mark.gpu
def test_gpu_fi_larger_workspace_eager_keeps_the_bits(fi_gpu):
    _same_bits_across_workspaces("cuda", fi_gpu, dims=(2, 4, 128, 128), graphs=False)


@pytest.mark.gpu
def test_gpu_fi_groups_keep_the_bits(fi_gpu):
    """Real FlashInfer: a step of 7 sequences through workspaces of 7, 3 and 2 rows (1, 3 and 4
    calls), eagerly and replayed from graphs, gives the same bits."""
    _grouped_same_bits("cuda", fi_gpu, (2, 4, 128, 128), graphs=False)
    _grouped_same_bits("cuda", fi_gpu, (2, 4, 128, 128), graphs=True)


@pytest.mark.gpu
def test_gpu_fi_graph_warm_equals_cold(fi_gpu):
    """Warm == cold when every call replays a graph: one captured workspace for all the steps."""
    ws = FiWorkspace(2048 + 300, 1, 2, 4, 128, 128, BF, "cuda", max_checkpoints=2048 // 64)
    assert fi_capture(ws, 1024) == len(fi_intervals(1024))
    _warm_cold("cuda", fi_gpu, L=2048, B=1024, cut=960, dims=(2, 4, 128, 128), ws=ws)
    assert ws.calls == {"graph": 4, "eager": 0}

