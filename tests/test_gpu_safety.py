"""Memory safety and the error flag on a GPU (issue 14; marker ``gpu``), and a workload for CUDA's
compute-sanitizer.

Qwen3-Next shapes: HK 16, HV 32, K = V = 128, conv width 4 (C = 8192), bf16 inputs, fp32 state
pool. The cases of the CPU tier (tests/test_memory_safety.py), on CUDA:
    * slots num_slots, 1000, 10**6, -2, -7 as read / write / checkpoint slots of every kernel
      (gdn_decode with and without PDL, gdn_decode_multi with PDL, conv_decode, conv_prefill,
      gdn_chunk_prefill): the outputs and pools are bit-identical to a run with those slots
      replaced by -1, the flag is ERR_SLOT, and the pool's guard slots (8 before it, and after it
      enough for slot 1000 to land in one: ~2 GB for the state pool) are unchanged;
    * metadata beyond the tensors (tests/helpers.py BEYOND): the expected flag, guard rows around
      outputs and workspace unchanged, no CUDA error; cu_seqlens past T equals the clipped run;
    * the planner's flag through run_gdn_core, eager and replayed from a CUDA graph (PDL on).

Sanitizer: run this file as a script, from the repository root, on a GPU machine. It launches
every kernel on random plans with invalid slots and metadata past the tensors (a few seconds of
GPU work without a tool; the tools slow kernels 10-100x):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --leak-check no \\
        python tests/test_gpu_safety.py
    compute-sanitizer --tool racecheck python tests/test_gpu_safety.py
    compute-sanitizer --tool synccheck python tests/test_gpu_safety.py

PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so that memcheck sees an
access just past a tensor (PyTorch's caching allocator would put it inside one of its segments).
Each tool must report "0 errors"; the script itself exits 1 if a flag is not what it expects.
"""

from __future__ import annotations

import os
import random
import sys

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.chunk import ChunkWorkspace, gdn_chunk_prefill
from gdn_graphs.ops.common import ERR_SLOT, ERR_TOKENS, error_names
from gdn_graphs.ops.conv import conv_decode, conv_prefill
from gdn_graphs.ops.conv_multi import conv_decode_multi
from gdn_graphs.ops.decode import gdn_decode, gdn_decode_multi, pdl_supported
from gdn_graphs.ops.meta import chunk_meta
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import write_block
from helpers import (BEYOND, BEYOND_T, Out, assert_bits_equal, assert_only_slots_changed,
                     beyond_meta, decode_rows, guarded_pool, guarded_workspace, inside_nan, ok,
                     prefill_meta, prefill_rows)

HK, HV, K, V, W = 16, 32, 128, 128, 4
C = 2 * HK * K + HV * V
NS = 16
BAD = (NS, 1000, 10 ** 6, -2, -7)
G0 = 8
GUARDS = (G0, 1000 - NS + 4)
bf16, f32 = torch.bfloat16, torch.float32


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def weights(device, seed=1):
    gen = torch.Generator().manual_seed(seed)
    conv_w = (0.5 * torch.randn(C, W, generator=gen)).to(bf16).to(device)
    A_log = (torch.rand(HV, generator=gen) * 2 - 1).to(device)
    dt_bias = torch.randn(HV, generator=gen).to(device)
    return conv_w, A_log, dt_bias


def inputs(T, device, seed):
    """x [T, C] (bf16, conv inputs and, split, q | k | v), a, b [T, HV]: views inside NaN rows."""
    x = inside_nan(T, C, seed=seed, dtype=bf16, device=device)
    a = inside_nan(T, HV, seed=seed + 1, dtype=bf16, device=device)
    b = inside_nan(T, HV, seed=seed + 2, dtype=bf16, device=device)
    return x, a, b


def split(y):
    return (y[:, :HK * K].unflatten(1, (HK, K)), y[:, HK * K:2 * HK * K].unflatten(1, (HK, K)),
            y[:, 2 * HK * K:].unflatten(1, (HV, V)))


def ssm_pool(device, seed=0, guards=GUARDS):
    """A guarded fp32 state pool of small states (as in a model): (buffer, pool)."""
    buf, pool = guarded_pool(NS, (HV, V, K), f32, device, pad=4, seed=seed, guards=guards)
    pool.mul_(0.1)
    return buf, pool


def conv_pool(device, seed=0, guards=GUARDS):
    return guarded_pool(NS, (C, W - 1), bf16, device, pad=8, seed=seed, guards=guards)


def flag(device):
    return torch.zeros(1, dtype=torch.int32, device=device)


def slots(xs, device):
    return torch.tensor(xs, dtype=torch.int32, device=device)


def clean(xs):
    """The slots a kernel uses for ``xs`` (each outside [-1, NS) replaced by NO_SLOT)."""
    if isinstance(xs, (list, tuple)):
        return type(xs)(clean(x) for x in xs)
    return ok(xs, NS)


# --------------------------------------------------------------------------------------------
# slots outside the pool: bit-identical to NO_SLOT, flagged, guards intact
# --------------------------------------------------------------------------------------------

def bad_vs_clean(run, bufs, code):
    """``run(kind)`` launches with the bad slots (kind "bad") or with each of them replaced by
    NO_SLOT ("clean"), from the same contents of the pool buffers ``bufs``, and returns its output
    tensors and its flag. Checks the flags (``code``, 0) and that every output and pool buffer is
    bit-identical between the two; returns (the buffers before, the buffers after the bad run)."""
    before = [b.clone() for b in bufs]
    res = {}
    for kind in ("bad", "clean"):
        for b, b0 in zip(bufs, before):
            b.copy_(b0)
        *outs, fl = run(kind)
        torch.cuda.synchronize()
        res[kind] = ([o.clone() for o in outs] + [b.clone() for b in bufs], fl.item())
    assert (res["bad"][1], res["clean"][1]) == (code, 0), error_names(res["bad"][1])
    for i, (t_bad, t_clean) in enumerate(zip(res["bad"][0], res["clean"][0])):
        assert_bits_equal(t_bad, t_clean, f"output {i}" if i < len(outs) else "pool")
    return before, res["bad"][0][len(outs):]


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("bad", BAD)
def test_gpu_decode_bad_slots(bad, pdl, gpu):
    rows = {"bad": decode_rows(bad), "clean": clean(decode_rows(bad))}
    N = len(rows["bad"])
    _, A_log, dt_bias = weights(gpu)
    x, a, b = inputs(N, gpu, seed=3)
    q, k, v = split(x)
    buf, pool = ssm_pool(gpu, seed=bad % 97)

    def run(kind):
        out, fl = Out(N, HV, V, dtype=bf16, device=gpu), flag(gpu)
        gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, slots([r for r, _ in rows[kind]], gpu),
                   slots([w for _, w in rows[kind]], gpu), out=out.t, pdl=pdl, error_flag=fl)
        out.check()
        return out.t, fl
    (buf0,), (after,) = bad_vs_clean(run, [buf], ERR_SLOT)
    written = {w for _, w in rows["clean"] if w >= 0}
    assert_only_slots_changed(after, buf0, written, GUARDS, state=HV * V * K)


@pytest.mark.gpu
def test_gpu_decode_multi_bad_slots_and_tokens_past_T(gpu):
    """PDL varlen decode: bad read and per-token write slots, and a last row running past T."""
    T = 6
    cu = [0, 2, 3, 6, 9]              # row 3 lies beyond the 6 tokens
    reads = [0, 1000, 1, -7]
    wtab = [[2, 10 ** 6, NO_SLOT], [NS, NO_SLOT, NO_SLOT], [-2, 3, 4], [5, 6, 7]]
    args = {"bad": (cu, reads, wtab), "clean": (cu[:4] + [6], clean(reads), clean(wtab))}
    _, A_log, dt_bias = weights(gpu)
    x, a, b = inputs(T, gpu, seed=4)
    q, k, v = split(x)
    buf, pool = ssm_pool(gpu, seed=5)

    def run(kind):
        out, fl = Out(T, HV, V, dtype=bf16, device=gpu), flag(gpu)
        gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, pool,
                         *(slots(t, gpu) for t in args[kind]), out=out.t, pdl=True, error_flag=fl)
        out.check()
        return out.t, fl
    (buf0,), (after,) = bad_vs_clean(run, [buf], ERR_SLOT | ERR_TOKENS)
    assert_only_slots_changed(after, buf0, {2, 3, 4}, GUARDS, state=HV * V * K)


@pytest.mark.gpu
@pytest.mark.parametrize("bad", BAD)
def test_gpu_conv_decode_bad_slots(bad, gpu):
    rows = {"bad": decode_rows(bad), "clean": clean(decode_rows(bad))}
    N = len(rows["bad"])
    conv_w, _, _ = weights(gpu)
    x, _, _ = inputs(N, gpu, seed=6)
    buf, pool = conv_pool(gpu, seed=7)

    def run(kind):
        y, fl = Out(N, C, dtype=bf16, device=gpu), flag(gpu)
        conv_decode(x, conv_w, None, pool, slots([r for r, _ in rows[kind]], gpu),
                    slots([w for _, w in rows[kind]], gpu), out=y.t, error_flag=fl)
        y.check()
        return y.t, fl
    (buf0,), (after,) = bad_vs_clean(run, [buf], ERR_SLOT)
    assert_only_slots_changed(after, buf0, {1, 3, 4}, GUARDS, state=C * (W - 1))


@pytest.mark.gpu
@pytest.mark.parametrize("bad", BAD)
def test_gpu_prefill_bad_slots(bad, gpu):
    rows = {"bad": prefill_rows(bad)}
    rows["clean"] = [(n, q, ok(r, NS), ok(w, NS), clean(ck)) for n, q, r, w, ck in rows["bad"]]
    T = sum(r[1] for r in rows["bad"]) + 7
    conv_w, A_log, dt_bias = weights(gpu)
    x, a, b = inputs(T, gpu, seed=8)
    cbuf, cpool = conv_pool(gpu, seed=9)
    sbuf, spool = ssm_pool(gpu, seed=10)
    ws, ws_check = guarded_workspace(T, HV, K, V, bf16, gpu, HK=HK)

    def run(kind):
        meta = prefill_meta(rows[kind], gpu)
        y, out = Out(T, C, dtype=bf16, device=gpu), Out(T, HV, V, dtype=bf16, device=gpu)
        fl = flag(gpu)
        conv_prefill(x, conv_w, None, cpool, meta, out=y.t, error_flag=fl)
        q, k, v = split(y.t)
        gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, spool, meta, out=out.t, workspace=ws,
                          error_flag=fl)
        y.check()
        out.check()
        ws_check()
        return y.t, out.t, fl
    (cbuf0, sbuf0), (c_after, s_after) = bad_vs_clean(run, [cbuf, sbuf], ERR_SLOT)
    written = {s for *_, w, ck in rows["clean"] for s in (w, *ck) if s >= 0}
    assert_only_slots_changed(c_after, cbuf0, written, GUARDS, state=C * (W - 1))
    assert_only_slots_changed(s_after, sbuf0, written, GUARDS, state=HV * V * K)


# --------------------------------------------------------------------------------------------
# metadata beyond the tensors
# --------------------------------------------------------------------------------------------

SMALL_GUARDS = (G0, G0)  # slots 1..6 only: these tests need no guard for slot 1000


def _prefill_once(meta, T, gpu, seed=11):
    conv_w, A_log, dt_bias = weights(gpu)
    x, a, b = inputs(T, gpu, seed=seed)
    cbuf, cpool = conv_pool(gpu, seed=12, guards=SMALL_GUARDS)
    sbuf, spool = ssm_pool(gpu, seed=13, guards=SMALL_GUARDS)
    cbuf0, sbuf0 = cbuf.clone(), sbuf.clone()
    ws, ws_check = guarded_workspace(T, HV, K, V, bf16, gpu, HK=HK)
    y, out = Out(T, C, dtype=bf16, device=gpu), Out(T, HV, V, dtype=bf16, device=gpu)
    f_conv, f_chunk = flag(gpu), flag(gpu)
    conv_prefill(x, conv_w, None, cpool, meta, out=y.t, error_flag=f_conv)
    q, k, v = split(x)   # the chunk kernels on x itself: independent of conv's outputs
    gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, spool, meta, out=out.t, workspace=ws,
                      error_flag=f_chunk)
    torch.cuda.synchronize()   # a CUDA error (illegal address) would surface here
    y.check()
    out.check()
    ws_check()
    assert_only_slots_changed(cbuf, cbuf0, range(1, 7), SMALL_GUARDS, state=C * (W - 1))
    assert_only_slots_changed(sbuf, sbuf0, range(1, 7), SMALL_GUARDS, state=HV * V * K)
    assert not y.t.isnan().any() and not out.t.isnan().any(), "a read outside the tensors"
    assert not cpool[1:7].isnan().any() and not spool[1:7].isnan().any()
    return f_conv.item(), f_chunk.item(), (y.t.clone(), out.t.clone(), cbuf, sbuf)


@pytest.mark.gpu
@pytest.mark.parametrize("name,fields,conv_code,chunk_code", BEYOND, ids=[b[0] for b in BEYOND])
def test_gpu_prefill_metadata_beyond_the_tensors(name, fields, conv_code, chunk_code, gpu):
    f_conv, f_chunk, _ = _prefill_once(beyond_meta(fields, gpu), BEYOND_T, gpu)
    assert (f_conv, f_chunk) == (conv_code, chunk_code), (error_names(f_conv), error_names(f_chunk))


@pytest.mark.gpu
def test_gpu_cu_past_T_equals_the_clipped_batch(gpu):
    _, _, past = _prefill_once(beyond_meta(dict(cu=[0, 40, 90]), gpu), BEYOND_T, gpu)
    _, _, clipped = _prefill_once(beyond_meta({}, gpu), BEYOND_T, gpu)
    for what, p, c in zip(("conv outputs", "outputs", "conv pool", "state pool"), past, clipped):
        assert_bits_equal(p, c, what)


@pytest.mark.gpu
def test_gpu_launchers_refuse_host_meta_longer_than_the_tensors(gpu):
    conv_w, A_log, dt_bias = weights(gpu)
    x, a, b = inputs(70, gpu, seed=14)
    q, k, v = split(x)
    meta = chunk_meta([40, 50], [0, 5], [-1, 1], [2, 3], [[], []], 64, device=gpu, num_slots=NS)
    _, spool = ssm_pool(gpu, guards=SMALL_GUARDS)
    _, cpool = conv_pool(gpu, guards=SMALL_GUARDS)
    with pytest.raises(ValueError, match="meta covers 90 tokens"):
        gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, spool, meta)
    with pytest.raises(ValueError, match="meta covers 90 tokens"):
        conv_prefill(x, conv_w, None, cpool, meta)


# --------------------------------------------------------------------------------------------
# the planner's flag through the GDN core, eager and in a CUDA graph
# --------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_core_flag_eager_and_graph_replay(gpu):
    conv_w, A_log, dt_bias = weights(gpu)
    cbuf, cpool = conv_pool(gpu, seed=15, guards=SMALL_GUARDS)
    sbuf, spool = ssm_pool(gpu, seed=16, guards=SMALL_GUARDS)
    w, pools = GDNWeights(conv_w, None, A_log, dt_bias), GDNPools(cpool, spool)
    p = GDNPlanner(PlanLimits(max_seqs=4, max_tokens=256, block_size=64, num_slots=NS,
                              max_blocks_per_seq=8), gpu)
    ws = ChunkWorkspace(256, HV, K, V, bf16, gpu, HK=HK)
    x, a, b = inputs(256, gpu, seed=17)

    # eager mixed step, a checkpoint slot corrupted on the device
    step = p.plan([5, 0], [1, 130], [[1], [2, 3, 4]])
    p.prefill.ckpt_slots[1] = 10 ** 6
    run_gdn_core(x[:140], a[:140], b[:140], w, pools, step, torch.empty(140, HV, V, dtype=bf16,
                                                                        device=gpu), ws)
    assert p.read_errors() == ERR_SLOT

    # decode graph (PDL where supported), captured on the template, replayed after new plans
    out = torch.zeros(2, HV, V, dtype=bf16, device=gpu)
    p.plan([7, 9], [1, 1], [[5], [6]])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run_gdn_core(x[:2], a[:2], b[:2], w, pools, p.template(2), out)   # compile, warm up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_gdn_core(x[:2], a[:2], b[:2], w, pools, p.template(2), out)
    p.plan([8, 10], [1, 1], [[5], [6]])
    graph.replay()
    assert p.read_errors() == 0
    p.plan([9, 11], [1, 1], [[5], [6]])
    p.decode_write[1] = NS          # one past the pool
    sbuf0 = sbuf.clone()
    graph.replay()
    assert p.read_errors() == ERR_SLOT
    assert_only_slots_changed(sbuf, sbuf0, {5}, SMALL_GUARDS, state=HV * V * K)
    p.plan([10, 12], [1, 1], [[5], [6]])
    graph.replay()
    assert p.read_errors() == 0


# --------------------------------------------------------------------------------------------
# compute-sanitizer workload
# --------------------------------------------------------------------------------------------

def sanitizer_workload(device="cuda", seed: int = 0, steps: int = 6) -> list[int]:
    """Launch every kernel on random plans whose device slot buffers are then corrupted with
    values outside the pool, and on metadata that runs past the tensors; check each step's flag.
    Meant to run under compute-sanitizer (see the module docstring): small pools, no guards (the
    tool checks the bounds), about a second of GPU work. Returns the flags it read."""
    rng = random.Random(seed)
    num_slots = 64
    bad_values = (num_slots, num_slots + 1, 1000, 10 ** 6, 2 ** 31 - 1, -2, -7, -2 ** 31)
    dev = torch.device(device)
    conv_w, A_log, dt_bias = weights(dev, seed)
    gen = torch.Generator().manual_seed(seed)
    cpool = torch.randn(num_slots, C, W - 1, generator=gen).to(bf16).to(dev)
    spool = (0.1 * torch.randn(num_slots, HV, V, K, generator=gen)).to(dev)
    pools, w = GDNPools(cpool, spool), GDNWeights(conv_w, None, A_log, dt_bias)
    B, max_tokens = 64, 512
    p = GDNPlanner(PlanLimits(max_seqs=6, max_tokens=max_tokens, block_size=B,
                              num_slots=num_slots, max_blocks_per_seq=16), dev)
    ws = ChunkWorkspace(max_tokens, HV, K, V, bf16, dev, HK=HK)
    flags = []

    def expect(code, what):
        flags.append(code)
        if code != what:
            raise AssertionError(f"flag {code} ({error_names(code)}), expected {what}")

    for _ in range(steps):
        rows = rng.randint(1, 5)
        nd = rng.randint(0, rows)                     # leading decode rows
        qs = [1] * nd + [rng.randint(1, 100) for _ in range(rows - nd)]
        ns = [rng.randint(0, 300) for _ in range(rows)]
        free = rng.sample(range(num_slots), num_slots)
        tables = [[free.pop() for _ in range(write_block(n, q, B) + 1)] for n, q in zip(ns, qs)]
        step = p.plan(ns, qs, tables)
        h = step.host
        live = ([p.decode_read[:h.num_decodes], p.decode_write[:h.num_decodes]]
                + [p.prefill.read_slot[:h.num_prefills], p.prefill.write_slot[:h.num_prefills],
                   p.prefill.ckpt_slots[:h.num_ckpts]])
        live = [t for t in live if t.numel()]
        n_bad = rng.randint(0, 3)
        for _ in range(n_bad):
            t = rng.choice(live)
            t[rng.randrange(t.numel())] = rng.choice(bad_values)
        T = step.num_tokens + rng.randint(0, 9)
        x, a, b = inputs(T, dev, seed=rng.randint(0, 1000))
        run_gdn_core(x, a, b, w, pools, step, torch.empty(T, HV, V, dtype=bf16, device=dev), ws)
        expect(p.read_errors(), ERR_SLOT if n_bad else 0)

    # device metadata past the tensors and inconsistent tables, each prefill kernel
    T = BEYOND_T
    x, a, b = inputs(T, dev, seed=seed + 50)
    q, k, v = split(x)
    for _, fields, conv_code, chunk_code in BEYOND:
        meta = beyond_meta(fields, dev)
        fl = flag(dev)
        conv_prefill(x, conv_w, None, cpool, meta, out=torch.empty(T, C, dtype=bf16, device=dev),
                     error_flag=fl)
        expect(fl.item(), conv_code)
        fl = flag(dev)
        gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, spool, meta, workspace=ws, error_flag=fl)
        expect(fl.item(), chunk_code)

    # varlen decode (PDL where supported) with bad slots and a row past T
    fl = flag(dev)
    gdn_decode_multi(q[:6], k[:6], v[:6], a[:6], b[:6], A_log, dt_bias, spool,
                     slots([0, 2, 3, 6, 2 ** 31 - 1], dev), slots([1, 10 ** 6, -7, 3], dev),
                     slots([[4, 5], [num_slots, NO_SLOT], [6, -2], [7, 8]], dev),
                     pdl=pdl_supported(dev), error_flag=fl)
    expect(fl.item(), ERR_SLOT | ERR_TOKENS)
    # its conv partner (speculative rows): the same rows, windows of the conv pool
    fl = flag(dev)
    conv_decode_multi(x[:6], conv_w, None, cpool, slots([0, 2, 3, 6, 2 ** 31 - 1], dev),
                      slots([1, 10 ** 6, -7, 3], dev),
                      slots([[4, 5], [num_slots, NO_SLOT], [6, -2], [7, 8]], dev), error_flag=fl)
    expect(fl.item(), ERR_SLOT | ERR_TOKENS)
    torch.cuda.synchronize()
    return flags


@pytest.mark.gpu
def test_gpu_sanitizer_workload_runs(gpu):
    """The sanitizer script's workload, without a sanitizer: every flag as expected, no CUDA
    error."""
    flags = sanitizer_workload(gpu)
    assert ERR_SLOT in flags and 0 in flags


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("tests/test_gpu_safety.py needs a CUDA GPU")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        print("note: without PYTORCH_NO_CUDA_MEMORY_CACHING=1, memcheck cannot see an access that "
              "stays inside one of PyTorch's cached segments", file=sys.stderr)
    seen = sanitizer_workload()
    print(f"sanitizer workload done: {len(seen)} flags checked")
