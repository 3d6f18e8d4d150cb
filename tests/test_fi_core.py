"""gdn_fi_prefill inside the engine: run_gdn_core's routing (fi_route) and its steps, with the
torch stand-in of FlashInfer on the CPU and the real kernel on the GPU (``-m gpu``), and the
sm90 compile of the FI path's Triton kernels (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import fi_standin
from gdn_graphs.ops.fi_prefill import FiWorkspace
from helpers import assert_bits_equal, rel
from test_fi_prefill import BF, DIMS, TOL, fi_gpu  # noqa: F401 - fi_gpu is a fixture


# ---------------------------------------------------------------------------------------------
# routing inside run_gdn_core
# ---------------------------------------------------------------------------------------------

def test_core_routes_aligned_prefills_to_fi(monkeypatch):
    """run_gdn_core runs a step's prefill on gdn_fi_prefill when the chunk workspace carries a
    FiWorkspace and every prefill start is a multiple of 64 (a capture template, a mid-chunk
    start, a bf16 pool or a step too big for the FiWorkspace: our kernel), and both paths give
    the same outputs and slots (bf16 tolerance) on the same steps."""
    from gdn_graphs.ops.chunk import ChunkWorkspace
    from gdn_graphs.runtime import core
    from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
    from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits

    HK, HV, K, V, W, B = 1, 2, 32, 32, 4, 128
    C = 2 * HK * K + HV * V
    calls = []
    real = core.gdn_fi_prefill
    monkeypatch.setattr(core, "gdn_fi_prefill", lambda *a, **kw: calls.append(kw["every"]) or real(*a, **kw))
    gen = torch.Generator().manual_seed(0)
    w = GDNWeights((0.5 * torch.randn(C, W, generator=gen)).to(BF), None, torch.rand(HV, generator=gen),
                   torch.randn(HV, generator=gen))
    x = torch.randn(420, C, generator=gen).to(BF)
    a, b = torch.randn(420, HV, generator=gen).to(BF), torch.randn(420, HV, generator=gen).to(BF)
    table = [list(range(8 * i, 8 * i + 8)) for i in range(3)]

    def run(fi, rows, pool_dtype=torch.float32, max_seqs=3):
        planner = GDNPlanner(PlanLimits(max_seqs=3, max_tokens=420, block_size=B, num_slots=24,
                                        max_blocks_per_seq=8))
        ws = ChunkWorkspace(420, HV, K, V, BF, "cpu", HK=HK)
        if fi:
            ws.fi = FiWorkspace(420, max_seqs, HK, HV, K, V, BF, "cpu", max_checkpoints=420 // 64,
                                fn=fi_standin.chunk_gated_delta_rule)
        g2 = torch.Generator().manual_seed(1)
        pools = GDNPools(torch.randn(24, C, W - 1, generator=g2).to(BF),
                         (0.3 * torch.randn(24, HV, V, K, generator=g2)).to(pool_dtype))
        n, q = zip(*rows)
        step = planner.plan(list(n), list(q), table[:len(rows)])
        T = sum(q) + 5
        out = torch.empty(T, HV, V, dtype=BF)
        run_gdn_core(x[:T], a[:T], b[:T], w, pools, step, out, ws)
        return out, pools.ssm

    for rows, want in [([(0, 300), (256, 100)], [128]),      # block-aligned: every = B
                       ([(5, 1), (192, 200)], [64]),          # a decode row, a start at 192: every 64
                       ([(37, 100)], []),                     # mid-chunk start: ours
                       ([(0, 100), (0, 50), (128, 10)], [128])]:  # 3 rows > max_seqs=2: groups
        calls.clear()
        o_fi, s_fi = run(True, rows, max_seqs=2)
        assert calls == want, (rows, calls)
        o, s = run(False, rows)
        assert rel(o_fi, o) < TOL and rel(s_fi, s) < TOL, rows
        assert torch.equal(o_fi[-5:], torch.zeros_like(o_fi[-5:]))
    calls.clear()
    run(True, [(0, 300)], pool_dtype=BF)
    assert calls == [], "a bf16 pool runs our kernel"


def _core_steps(device, dims, make_fi, L, B, cuts, monkeypatch):
    """One prompt of L tokens through run_gdn_core (GDNPlanner, conv + GDN), once in one step and
    once in two steps cut at each of ``cuts`` (a decode row of another request beside the second
    step), with ``make_fi()`` as the chunk workspace's FiWorkspace. Every prefill must run on
    gdn_fi_prefill; the second step's outputs and the final pools equal the one-step run's bit
    for bit; the one-step outputs match our kernel's (bf16 tolerance)."""
    from gdn_graphs.ops.chunk import ChunkWorkspace
    from gdn_graphs.runtime import core
    from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
    from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits

    HK, HV, K, V = dims
    W, C, nb = 4, 2 * HK * K + HV * V, L // B + 1
    calls = []
    real = core.gdn_fi_prefill
    monkeypatch.setattr(core, "gdn_fi_prefill", lambda *a, **kw: calls.append(kw["every"]) or real(*a, **kw))
    gen = torch.Generator().manual_seed(7)
    w = GDNWeights((0.5 * torch.randn(C, W, generator=gen)).to(BF).to(device), None,
                   torch.rand(HV, generator=gen).to(device), torch.randn(HV, generator=gen).to(device))
    x = torch.randn(L + 1, C, generator=gen).to(BF).to(device)
    a = torch.randn(L + 1, HV, generator=gen).to(BF).to(device)
    b = torch.randn(L + 1, HV, generator=gen).to(BF).to(device)
    tables = [list(range(nb)), list(range(nb, 2 * nb))]  # prompt, decode request

    def run(rows, fi=True, pools=None):
        planner = GDNPlanner(PlanLimits(max_seqs=2, max_tokens=L + 1, block_size=B, num_slots=2 * nb,
                                        max_blocks_per_seq=nb), device)
        ws = ChunkWorkspace(L + 1, HV, K, V, BF, device, HK=HK)
        ws.fi = make_fi() if fi else None
        pools = pools or GDNPools(torch.zeros(2 * nb, C, W - 1, dtype=BF, device=device),
                                  torch.zeros(2 * nb, HV, V, K, device=device))
        n, q, t = zip(*rows)
        step = planner.plan(list(n), list(q), [tables[i] for i in t])
        T = sum(q)
        out = torch.empty(T, HV, V, dtype=BF, device=device)
        run_gdn_core(_rows(x, rows), _rows(a, rows), _rows(b, rows), w, pools, step, out, ws)
        return out, pools

    def _rows(t, rows):  # the batch: decode rows take token L of t, the prompt rows its [n, n+q)
        return torch.cat([t[L:L + 1] if ti == 1 else t[n:n + q] for n, q, ti in rows])

    one, p1 = run([(0, L, 0)])
    assert calls == [B] and torch.isfinite(one.float()).all()
    ours, _ = run([(0, L, 0)], fi=False)
    assert rel(one, ours) < TOL
    for c in cuts:
        calls.clear()
        _, p2 = run([(0, c, 0)])
        two, p2 = run([(5, 1, 1), (c, L - c, 0)], pools=p2)
        assert len(calls) == 2, calls
        assert_bits_equal(two[1:], one[c:], f"cut {c}: outputs")
        for s in range(nb):
            assert_bits_equal(p2.ssm[s], p1.ssm[s], f"cut {c}: state slot {s}")
            assert_bits_equal(p2.conv[s], p1.conv[s], f"cut {c}: conv slot {s}")


def test_core_steps_equal_one_step_standin(monkeypatch):
    dims = DIMS
    _core_steps("cpu", dims, lambda: FiWorkspace(513, 2, *dims, BF, "cpu", max_checkpoints=8,
                                                 fn=fi_standin.chunk_gated_delta_rule),
                512, 128, [256, 192], monkeypatch)


@pytest.mark.gpu
def test_gpu_fi_core_steps_equal_one_step(fi_gpu, monkeypatch):
    """Real FlashInfer inside run_gdn_core (make_fi_workspace, as the vLLM builder makes it): a
    2048-token prompt in one step vs two steps cut at the block boundary 1024 and at 960 (inside
    a block: every 64), bit for bit, conv and GDN pools included."""
    from gdn_graphs.ops.fi_prefill import make_fi_workspace
    dims = (4, 8, 128, 128)

    def make():
        ws, why = make_fi_workspace(2049, 2, *dims, BF, torch.float32, "cuda")
        assert ws is not None, why
        return ws

    _core_steps("cuda", dims, make, 2048, 256, [1024, 960], monkeypatch)


def _conv_into_workspace(device, dims, make_fi, monkeypatch):
    """A step of a decode row and three aligned prefill rows (one from a stored block state)
    through run_gdn_core: the conv writing v straight into the FiWorkspace (one group, the default)
    gives the bits of the conv writing it to its own output and the prep copying it (outputs,
    conv and state pools)."""
    from gdn_graphs.ops.chunk import ChunkWorkspace
    from gdn_graphs.runtime import core
    from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
    from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits

    HK, HV, K, V = dims
    W, C, B, S = 4, 2 * HK * K + HV * V, 128, 32
    gen = torch.Generator().manual_seed(3)
    w = GDNWeights((0.5 * torch.randn(C, W, generator=gen)).to(BF).to(device), None,
                   torch.rand(HV, generator=gen).to(device), torch.randn(HV, generator=gen).to(device))
    rows = [(5, 1), (0, 300), (256, 100), (0, 64)]  # (start, tokens): a decode row first
    T = sum(q for _, q in rows) + 7
    x, a, b = (torch.randn(T, n, generator=gen).to(BF).to(device) for n in (C, HV, HV))
    conv0 = torch.randn(S, C, W - 1, generator=gen).to(BF).to(device)
    ssm0 = (0.3 * torch.randn(S, HV, V, K, generator=gen)).to(device)
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(4)]
    seen = []
    real = core.gdn_fi_prefill
    monkeypatch.setattr(core, "gdn_fi_prefill",
                        lambda *a, **kw: seen.append(kw["v_in_workspace"]) or real(*a, **kw))

    def run():
        planner = GDNPlanner(PlanLimits(max_seqs=4, max_tokens=T, block_size=B, num_slots=S,
                                        max_blocks_per_seq=8), device)
        ws = ChunkWorkspace(T, HV, K, V, BF, device, HK=HK)
        ws.fi = make_fi(T)
        pools = GDNPools(conv0.clone(), ssm0.clone())
        step = planner.plan([n for n, _ in rows], [q for _, q in rows], tables)
        out = torch.full((T, HV, V), float("nan"), dtype=BF, device=device)
        run_gdn_core(x, a, b, w, pools, step, out, ws)
        return out, pools

    o1, p1 = run()
    with monkeypatch.context() as m:
        m.setattr(core, "prefill_tail_ok", lambda *args: False)
        o2, p2 = run()
    assert seen == [True, False], seen
    assert_bits_equal(o1, o2, "outputs")
    assert_bits_equal(p1.ssm, p2.ssm, "state pool")
    assert_bits_equal(p1.conv, p2.conv, "conv pool")
    assert torch.isfinite(o1.float()).all()


def test_core_conv_into_workspace_keeps_the_bits(monkeypatch):
    _conv_into_workspace("cpu", DIMS, lambda T: FiWorkspace(
        T, 3, *DIMS, BF, "cpu", max_checkpoints=T // 64, fn=fi_standin.chunk_gated_delta_rule),
        monkeypatch)


@pytest.mark.gpu
def test_gpu_core_conv_into_workspace_keeps_the_bits(fi_gpu, monkeypatch):
    """The same with the real FlashInfer at its head size (make_fi_workspace, as in vLLM)."""
    from gdn_graphs.ops.fi_prefill import make_fi_workspace

    def make(T):
        ws, why = make_fi_workspace(T, 3, 2, 4, 128, 128, BF, torch.float32, "cuda")
        assert ws is not None, why
        return ws

    _conv_into_workspace("cuda", (2, 4, 128, 128), make, monkeypatch)


_COMPILE_SCRIPT = r"""
from gdn_graphs.ops import fi_kernels as F
from sm90_compile import compile_sm90, ptxas_report

HK, HV, K, V = 16, 32, 128, 128
kernels = [
    (F._fi_prep_kernel, dict(HK=HK, HV=HV, K=K, V=V, BK=K, BV=V, BT=16, BS=64, INTERPRET=False),
     dict(A_log="*fp32", dt_bias="*fp32", alpha="*fp32", beta="*fp32", cu64="*i64", ckcu="*i64")),
    (F._fi_gather_kernel, dict(N_ELEM=HV * V * K, TILE=F.STATE_TILE), dict(ssm="*fp32", h0="*fp32")),
    (F._fi_scatter_kernel, dict(N_ELEM=HV * V * K, TILE=F.STATE_TILE, BS=64),
     dict(ssm="*fp32", ck_states="*fp32", h_final="*fp32", cu64="*i64", ckcu="*i64")),
    (F._fi_out_kernel, dict(HV=HV, V=V, BV=V, BT=64), dict(cu64="*i64")),  # (no error flag)
]
meta = {"cu_seqlens", "start_pos", "read_slot", "write_slot", "ckpt_offsets", "ckpt_slots", "error_flag"}
ints = ("T", "T_ws", "seq0", "num_seqs", "ns_total", "max_seqs", "every", "v_ready", "n_ck_prog", "max_ckpts",
        "num_slots", "block_size")
for (heur, consts, special), has_flag in [(k, f) for k in kernels for f in (True, False)]:
    if not hasattr(heur, "values"):  # a plain jit function: no flag to compile out
        if has_flag:
            continue
        heur = type("NoHeuristics", (), {"fn": heur})
    fn = heur.fn
    ck = compile_sm90(fn, consts, special, meta, ints, has_flag, num_warps=4)
    regs, spills = ptxas_report(ck)
    print(fn.__name__, has_flag, "regs", regs, "spills", spills)
    assert max(spills) == 0, (fn.__name__, "spills registers")
"""


def test_fi_kernels_compile_for_sm90():
    """The four kernels compile for an H200 (sm_90, no interpreter shims) at the real shapes,
    with and without the error flag, without register spills. Needs no GPU (Triton's ptxas)."""
    import os

    from sm90_compile import ptxas_path, run_script
    if not os.path.exists(ptxas_path()):
        pytest.skip("this triton has no bundled ptxas")
    res = run_script(_COMPILE_SCRIPT)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]


def test_builders_capture_fi_graphs_once_per_workspace(monkeypatch):
    """The vLLM builders ask GDNResources for FlashInfer's graphs at start: once per FiWorkspace
    and block size (every GDN group makes a builder), none for a workspace without one."""
    from gdn_graphs.vllm import builder

    seen = []
    monkeypatch.setattr(builder, "fi_capture", lambda fw, B: seen.append((id(fw), B)) or 7)
    res = builder.GDNResources(max_reqs=4, max_tokens=256)
    plain = res.workspace(2, 32, 32, 1, BF, torch.device("cpu"))  # no FlashInfer option: no .fi
    with_fi = res.workspace(4, 32, 32, 2, BF, torch.device("cpu"))
    with_fi.fi = FiWorkspace(256, 4, 2, 4, 32, 32, BF, "cpu")
    for _ in range(3):  # three GDN groups, three builders
        builder.StepBuilder(res, 128, 8, 0, torch.device("cpu"))
    assert getattr(plain, "fi", None) is None
    assert seen == [(id(with_fi.fi), 128)]
