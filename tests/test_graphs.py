"""GraphManager with a mock CUDA backend (CPU tier), NVTX ranges, and a real capture (GPU tier)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from gdn_graphs import nvtx
from gdn_graphs.runtime.graphs import EagerFallbackWarning, GraphKey, GraphManager


class MockGraph:
    def __init__(self, backend, gid):
        self.backend, self.gid = backend, gid
        self.captured = False

    def replay(self):
        self.backend.log.append(("replay", self.gid))


class MockBackend:
    """Records every CUDA call the manager makes, and in which phase fn runs."""

    def __init__(self):
        self.log: list[tuple] = []
        self.phase = "eager"
        self.graphs: list[MockGraph] = []
        self.pools: list[object] = []

    def pool_handle(self):
        pool = object()
        self.pools.append(pool)
        self.log.append(("pool",))
        return pool

    def new_stream(self):
        self.log.append(("stream",))
        return "capture-stream"

    def new_graph(self):
        g = MockGraph(self, len(self.graphs))
        self.graphs.append(g)
        return g

    @contextlib.contextmanager
    def warmup_context(self, stream):
        assert stream == "capture-stream"
        self.phase = "warmup"
        yield
        self.phase = "eager"

    @contextlib.contextmanager
    def capture_context(self, graph, pool, stream):
        assert stream == "capture-stream" and not graph.captured
        self.log.append(("capture_begin", graph.gid, pool))
        self.phase = "capture"
        yield
        self.phase = "eager"
        graph.captured = True
        self.log.append(("capture_end", graph.gid))

    def replay(self, graph):
        assert graph.captured
        graph.replay()

    def synchronize(self):
        self.log.append(("sync",))


class Recorder:
    """fn(size) that records (phase, size) and returns a fresh output object."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[tuple[str, int]] = []

    def __call__(self, size):
        self.calls.append((self.backend.phase, size))
        return {"size": size, "phase": self.backend.phase}


def manager(buckets=(8, 1, 4, 2, 4), **kw):
    be = MockBackend()
    return GraphManager(buckets, backend=be, **kw), be


# ---------------------------------------------------------------- buckets


def test_buckets_sorted_deduplicated_and_bisect():
    gm, _ = manager()
    assert gm.buckets == (1, 2, 4, 8)
    assert [gm.bucket_for(n) for n in range(0, 10)] == [1, 1, 2, 4, 4, 8, 8, 8, 8, None]
    with pytest.raises(ValueError):
        gm.bucket_for(-1)


@pytest.mark.parametrize("bad", [[0], [-4], [2.0], [True]])
def test_bad_buckets(bad):
    with pytest.raises(ValueError):
        GraphManager(bad, backend=MockBackend())


def test_padded_size_only_for_captured_kinds():
    gm, be = manager()
    assert gm.padded_size("decode", 3) == 3  # nothing captured yet: eager, no padding
    gm.capture("decode", Recorder(be), progress=False)
    assert [gm.padded_size("decode", n) for n in (1, 3, 5, 8, 9, 100)] == [1, 4, 8, 8, 9, 100]
    assert gm.padded_size("mixed", 3) == 3


# ---------------------------------------------------------------- capture


def test_capture_largest_first_one_pool_warmup_count():
    gm, be = manager()
    fn = Recorder(be)
    gm.capture("decode", fn, warmup=3, progress=False)
    # per bucket, largest first: 3 warm-ups then exactly one captured call
    want = []
    for s in (8, 4, 2, 1):
        want += [("warmup", s)] * 3 + [("capture", s)]
    assert fn.calls == want
    begins = [e for e in be.log if e[0] == "capture_begin"]
    assert len(begins) == 4 and len(be.pools) == 1
    assert all(e[2] is be.pools[0] for e in begins)
    assert set(gm.captured) == {GraphKey("decode", s) for s in (1, 2, 4, 8)}
    assert gm.stats.captures == 4
    # a second kind shares the same pool and stream
    gm.capture("mixed", Recorder(be), warmup=0, progress=False)
    begins = [e for e in be.log if e[0] == "capture_begin"]
    assert len(begins) == 8 and len(be.pools) == 1 and all(e[2] is be.pools[0] for e in begins)
    assert sum(1 for e in be.log if e[0] == "stream") == 1


def test_capture_is_once_per_bucket_across_many_runs():
    gm, be = manager()
    fn = Recorder(be)
    gm.capture("decode", fn, progress=False)
    gm.capture("decode", fn, progress=False)  # already captured: nothing happens
    n_calls = len(fn.calls)
    for n in list(range(1, 9)) * 5:
        gm.run("decode", n, fn)
    assert len(fn.calls) == n_calls  # replays never call fn
    assert sum(1 for e in be.log if e[0] == "capture_begin") == 4
    assert gm.stats.captures == 4 and gm.stats.replays == 40


def test_bad_warmup():
    gm, be = manager()
    with pytest.raises(ValueError):
        gm.capture("decode", Recorder(be), warmup=-1, progress=False)


def test_progress_bar_path_runs():
    gm, be = manager((1, 2))
    gm.capture("decode", Recorder(be), progress=True)
    assert len(gm.captured) == 2


# ---------------------------------------------------------------- run


def test_replay_chooses_the_right_bucket_and_returns_static_outputs():
    gm, be = manager()
    gm.capture("decode", Recorder(be), progress=False)
    gid = {k.size: g.graph.gid for k, g in gm.captured.items()}
    for n, size in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)]:
        be.log.clear()
        out, used = gm.run("decode", n, lambda m: pytest.fail("eager call"))
        assert used == size
        assert out == {"size": size, "phase": "capture"}
        assert out is gm.captured[GraphKey("decode", size)].outputs
        assert be.log == [("replay", gid[size])]
    assert gm.stats.replays_by_key[GraphKey("decode", 4)] == 2


def test_eager_fallback_above_largest_bucket_warns_once_per_kind():
    gm, be = manager()
    fn = Recorder(be)
    gm.capture("decode", fn, progress=False)
    fn.calls.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in (9, 100, 9, 3, 17):
            out, used = gm.run("decode", n, fn)
            if n > 8:
                assert used == n and out == {"size": n, "phase": "eager"}
        gm.run("prefill", 5, fn)  # a kind never captured: eager, its own single warning
        gm.run("prefill", 6, fn)
    msgs = [str(x.message) for x in w if issubclass(x.category, EagerFallbackWarning)]
    assert len(msgs) == 2, msgs
    assert "above the largest captured bucket (8)" in msgs[0]
    assert "no graphs were captured for kind 'prefill'" in msgs[1]
    assert fn.calls == [("eager", 9), ("eager", 100), ("eager", 9), ("eager", 17),
                        ("eager", 5), ("eager", 6)]
    assert gm.stats.eager_fallbacks == 6 and gm.stats.replays == 1
    assert gm.stats.eager_by_kind == {"decode": 4, "prefill": 2}


def test_no_buckets_means_always_eager():
    gm, be = manager(())
    gm.capture("decode", Recorder(be), progress=False)
    assert gm.captured == {}
    with pytest.warns(EagerFallbackWarning):
        assert gm.run("decode", 1, lambda n: "eager")[0] == "eager"


def test_data_ptr_guard_raises_when_an_input_is_swapped():
    gm, be = manager((1, 2), debug_ptrs=True)
    bufs = {"a": torch.zeros(4), "b": torch.zeros(4)}
    gm.capture("decode", Recorder(be), inputs=lambda: [bufs["a"], bufs["b"]], progress=False)
    gm.run("decode", 2, Recorder(be))
    bufs["b"].copy_(torch.ones(4))  # in place: fine
    gm.run("decode", 1, Recorder(be))
    bufs["b"] = torch.ones(4)       # reassigned: the graph would read the old memory
    with pytest.raises(RuntimeError, match=r"decode/2: input tensor 1 moved"):
        gm.run("decode", 2, Recorder(be))
    assert gm.stats.replays == 2


def test_data_ptr_guard_off_by_default():
    gm, be = manager((1,))
    bufs = [torch.zeros(4)]
    calls = []
    gm.capture("decode", Recorder(be), inputs=lambda: calls.append(1) or bufs, progress=False)
    bufs[0] = torch.ones(4)
    gm.run("decode", 1, Recorder(be))
    assert calls == []  # inputs() is not even called without debug_ptrs


def test_clear_drops_graphs():
    gm, be = manager((1, 2))
    gm.capture("decode", Recorder(be), progress=False)
    gm.clear()
    assert gm.captured == {} and gm.padded_size("decode", 1) == 1
    gm.capture("decode", Recorder(be), progress=False)
    assert len(be.pools) == 2 and len(gm.captured) == 2


# ---------------------------------------------------------------- NVTX


class FakeNvtx:
    def __init__(self):
        self.events = []

    def push(self, name, payload=None):
        self.events.append(("push", name) if payload is None else ("push", name, payload))

    def pop(self):
        self.events.append(("pop",))


@pytest.fixture
def fake_nvtx():
    fake = FakeNvtx()
    nvtx.enable(True, backend=fake)
    try:
        yield fake
    finally:
        nvtx.enable(False)


def test_nvtx_off_by_default_records_nothing():
    assert not nvtx.enabled()
    with nvtx.range("x"):
        pass

    @nvtx.range("f")
    def f(a):
        return a + 1

    assert f(1) == 2


def test_nvtx_ranges_balanced_around_capture_replay_and_plan(fake_nvtx):
    from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits

    gm, be = manager((1, 2))
    gm.capture("decode", Recorder(be), progress=False)
    gm.run("decode", 2, Recorder(be))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.run("decode", 3, Recorder(be))  # above the largest bucket: eager
    p = GDNPlanner(PlanLimits(2, 64, 64, 8, 2))
    p.plan([0], [1], [[1]])
    pushed = [e[1:] for e in fake_nvtx.events if e[0] == "push"]
    for want in (("gdn.capture.decode", 2), ("gdn.capture.decode", 1), ("gdn.replay.decode", 2),
                 ("gdn.eager.decode", 3), ("gdn.plan", 1), ("gdn.plan.copy",)):
        assert want in pushed, (want, pushed)
    depth = 0
    for e in fake_nvtx.events:
        depth += 1 if e[0] == "push" else -1
        assert depth >= 0
    assert depth == 0


def test_nvtx_decorator_reads_flag_at_call_time():
    fake = FakeNvtx()

    @nvtx.range("deco")
    def f():
        return 7

    assert f() == 7
    nvtx.enable(True, backend=fake)
    try:
        assert f() == 7
        with nvtx.range("outer"):
            nvtx.enable(False)  # switched off inside a range: its pop still happens
    finally:
        nvtx.enable(False)
    assert fake.events == [("push", "deco"), ("pop",), ("push", "outer"), ("pop",)]


def test_nvtx_prefers_the_nvtx_package(monkeypatch):
    import sys
    import types

    calls = []
    mod = types.SimpleNamespace(
        push_range=lambda name, payload=None: calls.append((name, payload)),
        pop_range=lambda: calls.append("pop"))
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    nvtx.enable(True)
    try:
        with nvtx.range("pkg", 7):
            pass
    finally:
        nvtx.enable(False)
    assert calls == [("pkg", 7), "pop"]


def test_profiler_ranges_reach_a_torch_profiler_trace():
    """ProfilerRanges (gdn-graphs profile's backend) puts each range, with its payload, into
    torch.profiler's events; Tee sends the same ranges to a second backend."""
    from torch.profiler import profile

    fake = FakeNvtx()
    nvtx.enable(True, backend=nvtx.Tee(fake, nvtx.ProfilerRanges()))
    try:
        with profile() as prof:
            with nvtx.range("gdn.core", 3):
                with nvtx.range("gdn.core.decode", 3):
                    torch.ones(4).sum()
    finally:
        nvtx.enable(False)
    names = [e.name for e in prof.events()]
    assert "gdn.core" in names and "gdn.core.decode" in names
    assert fake.events == [("push", "gdn.core", 3), ("push", "gdn.core.decode", 3), ("pop",),
                           ("pop",)]


def test_torch_backend_captures_with_its_own_cublas_workspace(monkeypatch):
    """cuBLAS workspaces are cleared right before and after a capture (also when it fails), so
    the workspace a captured GEMM uses is made inside the graph's pool, where nothing else frees
    it (Inductor's cudagraph trees clear workspaces around their own captures)."""
    import contextlib

    from gdn_graphs.runtime.graphs import TorchCudaBackend

    calls = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("clear"),
                        raising=False)

    @contextlib.contextmanager
    def fake_graph(graph, pool=None, stream=None):
        calls.append(("capture", graph, pool, stream))
        yield
        calls.append("end")

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    be = TorchCudaBackend()
    with be.capture_context("g", "pool", "s"):
        calls.append("work")
    assert calls == ["clear", ("capture", "g", "pool", "s"), "work", "end", "clear"]
    calls.clear()
    with pytest.raises(RuntimeError):
        with be.capture_context("g", "pool", "s"):
            raise RuntimeError("capture failed")
    assert calls[0] == "clear" and calls[-1] == "clear"


# ---------------------------------------------------------------- GPU tier


@pytest.mark.gpu
def test_gpu_capture_replay_matches_eager_after_buffer_changes(gpu):
    torch.manual_seed(0)
    buf = torch.zeros(16, device=gpu)        # a persistent input, updated in place
    weight = torch.randn(16, 16, device=gpu)

    def fn(size):
        x = buf[:size]
        return torch.tanh(weight[:size, :size] @ x + x).cumsum(0)

    gm = GraphManager([1, 2, 4, 8], debug_ptrs=True)
    gm.capture("toy", fn, inputs=lambda: [buf, weight], progress=False)
    assert len(gm.captured) == 4
    for trial in range(20):
        buf.copy_(torch.randn(16, device=gpu))
        for n in (1, 3, 5, 8):
            out, size = gm.run("toy", n, fn)
            ref = fn(size)
            torch.cuda.synchronize()
            assert size == gm.bucket_for(n)
            assert torch.equal(out, ref), (trial, n)
    assert gm.stats.captures == 4 and gm.stats.replays == 80
    with pytest.warns(EagerFallbackWarning):
        out, size = gm.run("toy", 9, lambda m: fn(8))
    assert size == 9


@pytest.mark.gpu
def test_gpu_planner_buffers_drive_a_graph(gpu):
    """A graph that gathers pool rows through the planner's decode slots sees every new plan;
    back-to-back plans behind a slow kernel never clobber a staging buffer still being copied."""
    from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits

    S = 8
    planner = GDNPlanner(PlanLimits(S, 256, 64, 32, 4), gpu)
    pool = torch.randn(32, 5, device=gpu)

    def fn(size):
        r = planner.decode_read[:size].long()
        w = planner.decode_write[:size].long()
        got = torch.where((r >= 0)[:, None], pool[r.clamp(min=0)], torch.zeros((), device=gpu))
        return got + w[:, None].float()

    gm = GraphManager([1, 2, 4, 8], debug_ptrs=True)
    gm.capture("decode", fn, inputs=planner.buffers, progress=False)
    g = torch.Generator().manual_seed(1)
    for step in range(30):
        rows = int(torch.randint(1, S + 1, (1,), generator=g))
        slots = torch.randperm(32, generator=g)[:2 * rows].tolist()
        ns = [int(torch.randint(1, 256, (1,), generator=g)) for _ in range(rows)]
        tables = [[slots[2 * i]] * 4 for i in range(rows)]
        planner.plan(ns, [1] * rows, tables, pad_decodes_to=gm.padded_size("decode", rows))
        out, size = gm.run("decode", rows, fn)
        ref = fn(size)
        torch.cuda.synchronize()
        assert torch.equal(out, ref), step

    # staging ring: queue plans behind a long kernel, snapshot the buffer after each copy
    snaps, want = [], []
    torch.cuda._sleep(50_000_000)
    for k in range(6):
        tables = [[k + i] for i in range(3)]
        step = planner.plan([1, 2, 3], [1, 1, 1], tables).host
        snaps.append(planner.decode_read.clone())
        want.append(list(step.decode_read) + [-1] * (S - 3))
    torch.cuda.synchronize()
    assert [s.tolist() for s in snaps] == want
