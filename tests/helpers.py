"""What several test modules share: error measures, bit comparison, pools with guard slots, a
CPU stand-in for CUDA graphs, and the memory-safety cases of test_memory_safety (CPU tier) and
test_gpu_safety (GPU tier): tensors inside guard rows, bad-slot rows, metadata beyond the
tensors."""

from __future__ import annotations

import contextlib
import random

import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.common import ERR_META, ERR_TOKENS
from gdn_graphs.ops.meta import ChunkMeta, host_chunk_meta, make_chunk_meta
from gdn_graphs.ops.workspace import ChunkWorkspace

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def prompt_of(n: int, seed: int) -> list[int]:
    """A reproducible prompt of n token ids below 256 (the tiny presets' vocabulary)."""
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error ||x - ref|| / ||ref|| in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a float tensor, so that NaN compares equal to itself."""
    return t.contiguous().view(_INT_VIEW[t.element_size()])


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Bitwise equality (NaN-safe) of two tensors of the same dtype and shape."""
    assert a.dtype == b.dtype and a.shape == b.shape, what
    bad = (bits(a) != bits(b)).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}"


def guarded_pool(num_slots: int, slot_shape: tuple[int, ...], dtype, device, pad: int = 0,
                 seed: int = 0, guards: int | tuple[int, int] = 1
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool of random values inside a buffer with NaN guard slots before and after it (``guards``
    on each side, or ``(before, after)``: enough after it for slot 1000 to land in a guard);
    ``pad`` extra elements per slot give a slot stride larger than a state (vLLM pads its pages).
    Works for state pools [num_slots, HV, V, K] and conv pools [num_slots, C, W-1] alike.
    Returns (buffer, pool): a kernel that writes outside the pool changes a guard."""
    before, after = (guards, guards) if isinstance(guards, int) else guards
    n = 1
    for d in slot_shape:
        n *= d
    gen = torch.Generator().manual_seed(seed)
    vals = torch.randn(num_slots + 2, n + pad, generator=gen)[1:-1]  # (the draws of one guard)
    buf = torch.full((before + num_slots + after, n + pad), float("nan"), dtype=dtype,
                     device=device)
    buf[before:before + num_slots] = vals.to(dtype).to(device)
    return buf, buf[before:before + num_slots, :n].unflatten(1, slot_shape)


def assert_only_slots_changed(buf: torch.Tensor, buf0: torch.Tensor, written=(),
                              guards: int | tuple[int, int] = 1, state: int | None = None,
                              what: str = "pool") -> None:
    """``buf`` (a guarded_pool buffer, ``guards`` as given to it) equals its copy ``buf0`` bit for
    bit, except the states of the pool slots in ``written``: guards and untouched slots unchanged,
    and with ``state`` (the elements of one state) the page padding of written slots too.
    (Whether the written slots hold the right states is the caller's check.)"""
    before, after = (guards, guards) if isinstance(guards, int) else guards
    guards = before
    num_slots = buf.shape[0] - before - after
    written = set(written)
    for s in written:
        assert 0 <= s < num_slots, f"{what}: written slot {s} is outside the pool"
    same = (bits(buf) == bits(buf0)).all(dim=1)
    for r in (~same).nonzero().flatten().tolist():
        s = r - guards
        if s not in written:
            kind = "guard" if s < 0 or s >= num_slots else f"slot {s}"
            raise AssertionError(f"{what}: {kind} changed")
    for s in written:
        r = s + guards
        if state is not None and not torch.equal(bits(buf[r, state:]), bits(buf0[r, state:])):
            raise AssertionError(f"{what}: page padding of slot {s} changed")


class RerunBackend:
    """CPU stand-in for CUDA graphs (GraphManager's backend): a replay re-runs the captured
    ``fn(size)`` and copies its result into the graph's static outputs, which is what a replay
    means to the caller. Set ``manager`` (the GraphManager) and ``fn`` after capture (a dict
    kind -> fn where the manager captures several kinds)."""

    def __init__(self):
        self.manager = self.fn = None
        self.replays = 0

    def pool_handle(self):
        return "pool"

    def new_stream(self):
        return "stream"

    def new_graph(self):
        return object()

    def warmup_context(self, stream):
        return contextlib.nullcontext()

    def capture_context(self, graph, pool, stream):
        return contextlib.nullcontext()

    def replay(self, graph):
        key, entry = next((k, e) for k, e in self.manager.captured.items() if e.graph is graph)
        fn = self.fn[key.kind] if isinstance(self.fn, dict) else self.fn
        new = fn(key.size)
        if isinstance(new, torch.Tensor):
            entry.outputs.copy_(new)
        else:
            for dst, src in zip(entry.outputs, new):
                dst.copy_(src)
        self.replays += 1

    def synchronize(self):
        pass


# ---------------------------------------------------------------------------------------------
# memory safety (test_memory_safety, test_gpu_safety)
# ---------------------------------------------------------------------------------------------

MARGIN = 3          # guard rows around token tensors, outputs and workspace tensors
SENTINEL = 7.0      # what an output's guard rows hold


def ok(s: int, num_slots: int) -> int:
    """The slot a kernel uses for value s: itself inside the pool, NO_SLOT otherwise."""
    return s if 0 <= s < num_slots else NO_SLOT


def inside_nan(T: int, *shape, seed: int = 0, dtype=torch.float32, device="cpu",
               scale: float = 1.0) -> torch.Tensor:
    """A random [T, *shape] tensor that is a view into a buffer with MARGIN NaN rows on each side
    (a kernel that reads outside it gets NaN)."""
    gen = torch.Generator().manual_seed(seed)
    buf = torch.full((T + 2 * MARGIN, *shape), float("nan"), dtype=dtype, device=device)
    buf[MARGIN:MARGIN + T] = (scale * torch.randn(T, *shape, generator=gen)).to(dtype).to(device)
    return buf[MARGIN:MARGIN + T]


class Out:
    """An output [T, *shape] (``.t``) inside a buffer of SENTINEL rows; ``check()``: the rows
    around it were not written."""

    def __init__(self, T, *shape, dtype=torch.float32, device="cpu"):
        self.buf = torch.full((T + 2 * MARGIN, *shape), SENTINEL, dtype=dtype, device=device)
        self.t = self.buf[MARGIN:MARGIN + T]

    def check(self):
        assert (self.buf[:MARGIN] == SENTINEL).all(), "rows before the output were written"
        assert (self.buf[MARGIN + self.t.shape[0]:] == SENTINEL).all(), \
            "rows after the output were written"


def guarded_workspace(T, HV, K, V, dtype, device="cpu", HK=None):
    """A ChunkWorkspace for T tokens whose tensors sit inside NaN-guarded buffers (zeros inside,
    so that a stale row read by inconsistent metadata is finite, and a NaN result means a read
    outside the tensors): (workspace, check) where check() asserts that no guard changed."""
    ws = ChunkWorkspace(T, HV, K, V, dtype, device, HK=HK)
    bufs = {}
    for name in ("t", "p", "g", "qs", "kn"):
        t = getattr(ws, name)
        buf = torch.full((T + 2 * MARGIN, *t.shape[1:]), float("nan"), dtype=t.dtype,
                         device=device)
        buf[MARGIN:MARGIN + T] = 0
        bufs[name] = buf
        setattr(ws, name, buf[MARGIN:MARGIN + T])

    def check():
        for name, buf in bufs.items():
            guards = torch.cat([buf[:MARGIN], buf[MARGIN + T:]]).float()
            assert torch.isnan(guards).all(), f"workspace {name}: a guard row was written"
    return ws, check


def decode_rows(bad: int) -> list[tuple[int, int]]:
    """(read, write) slots of decode rows around a ``bad`` value: a move, a bad write, a bad
    read, both bad, in place, padding (slots 0..4 are used)."""
    return [(0, 1), (2, bad), (bad, 3), (bad, bad), (4, 4), (NO_SLOT, NO_SLOT)]


def prefill_rows(bad: int) -> list[tuple]:
    """(n, q, read, write, checkpoints) of prefill rows (B = 64) with ``bad`` as a checkpoint, a
    write and a read slot (slots 1..9 are used)."""
    return [(10, 130, 1, 2, [bad, 5]),        # boundaries 64 and 128
            (0, 70, NO_SLOT, bad, [6]),        # boundary 64
            (64, 20, bad, 7, []),
            (3, 5, 8, 9, [])]


def prefill_meta(rows, device="cpu", B=64) -> ChunkMeta:
    """A ChunkMeta of ``rows`` (slots unchecked: they may lie outside the pool), one padded row."""
    lists = host_chunk_meta([r[1] for r in rows], [r[0] for r in rows], [r[2] for r in rows],
                            [r[3] for r in rows], [r[4] for r in rows], B, check_slots=False,
                            max_seqs=len(rows) + 1)
    return make_chunk_meta(device, B, **lists)


def device_meta(B, cu, start, read, write, ck_off, ck_slots, chunk_seq, chunk_idx,
                device="cpu") -> ChunkMeta:
    """A ChunkMeta straight from device values, as the planner's buffers are (no host totals)."""
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    return ChunkMeta(t(cu), t(start), t(read), t(write), t(ck_off), t(ck_slots), t(chunk_seq),
                     t(chunk_idx), B)


# (name, ChunkMeta fields over T = 70 tokens and B = 64, the flag expected from conv_prefill and
# from gdn_chunk_prefill). Slots 1..6 are the only ones named. The valid base: cu [0, 40, 70],
# start [0, 5], read [-1, 1], write [2, 3], no checkpoints (row 0: 40 tokens from position 0,
# row 1: 30 from 5); _CK: row 0 of 66 tokens from 0, one checkpoint (64) into slot 4.
BEYOND_T = 70
_BASE = dict(cu=[0, 40, 70], start=[0, 5], read=[-1, 1], write=[2, 3], ck_off=[0, 0, 0],
             ck_slots=[-1], chunk_seq=[0, 1, -1, -1], chunk_idx=[0, 0, -1, -1])
_CK = dict(cu=[0, 66, 70], ck_off=[0, 1, 1], ck_slots=[4], chunk_seq=[0, 0, 1, -1],
           chunk_idx=[0, 1, 0, -1])
_TM = ERR_TOKENS | ERR_META
BEYOND = [
    ("valid", {}, 0, 0),
    ("valid with a checkpoint", _CK, 0, 0),
    ("cu past T", dict(cu=[0, 40, 90]), ERR_TOKENS, ERR_TOKENS),
    ("cu far past T", dict(cu=[0, 40, 10 ** 6]), ERR_TOKENS, ERR_TOKENS),
    # row 0 clipped to 70 tokens (its second chunk and its checkpoint are missing from the
    # tables: conv_prefill sees the checkpoint count, the chunk kernels do not read it); row 1
    # empty, yet in the chunk table
    ("cu near int32 max", dict(cu=[0, 2 ** 31 - 1, 2 ** 31 - 1]), _TM, _TM),
    ("cu negative", dict(cu=[-10, 40, 60]), ERR_TOKENS, ERR_TOKENS),
    ("cu int32 min", dict(cu=[-2 ** 31, 40, 70]), ERR_TOKENS, ERR_TOKENS),
    ("cu decreasing", dict(cu=[0, 50, 20]), _TM, _TM),       # row 1 empty, yet in the chunk table
    # position clipped to 2^30 - 1: row 0 then spans 2 chunks and a boundary the tables lack
    ("start near int32 max", dict(start=[2 ** 31 - 1, 5]), _TM, ERR_TOKENS),
    ("start negative", dict(start=[-100, 5]), ERR_TOKENS, ERR_TOKENS),
    ("chunk_seq past max_seqs", dict(chunk_seq=[0, 10 ** 6, -1, -1]), ERR_META, ERR_META),
    ("chunk_seq below -1", dict(chunk_seq=[0, 1, -5, -1]), ERR_META, ERR_META),
    ("chunk_idx past the span", dict(chunk_idx=[0, 10 ** 6, -1, -1]), ERR_META, ERR_META),
    ("chunk_idx negative", dict(chunk_idx=[-3, 0, -1, -1]), ERR_META, ERR_META),
    ("ckpt_offsets past the table", dict(_CK, ck_off=[10 ** 6, 10 ** 6 + 1, 1]), ERR_META,
     ERR_META),
    ("ckpt_offsets negative", dict(_CK, ck_off=[-7, 1, 1], ck_slots=[4, 5]), ERR_META, ERR_META),
    # two entries for a span with one boundary: the chunk kernels use the first, and never read
    # the end offset (no load added for it), so only conv_prefill can tell
    ("ckpt_offsets inconsistent", dict(_CK, ck_off=[0, 2, 2], ck_slots=[4, 5]), ERR_META, 0),
]


def beyond_meta(fields, device="cpu") -> ChunkMeta:
    """The device metadata of a BEYOND case."""
    d = dict(_BASE, **fields)
    return device_meta(64, d["cu"], d["start"], d["read"], d["write"], d["ck_off"],
                       d["ck_slots"], d["chunk_seq"], d["chunk_idx"], device=device)


def run_vllm_engines(tmp_path, model, configs: dict, full_graphs=()):
    """The vLLM GPU tests' engines: profiling/vllm_e2e.py once per ``configs`` entry (name ->
    its command-line arguments after --model), side by side, each with its own Triton cache and
    log; every one must exit 0 with our GDN layers on (and, for names in ``full_graphs``, FULL
    decode graphs captured). Returns (vllm_report's results for tmp_path, the report module)."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    procs = {}
    for name, args in configs.items():
        env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / f"tc_{name}"))
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(
            [sys.executable, str(root / "profiling" / "vllm_e2e.py"), "--model", str(model), *args,
             "--out", str(tmp_path / f"{name}.json")], stdout=log, stderr=subprocess.STDOUT,
            env=env), log)
    for name, (p, log) in procs.items():
        rc = p.wait(timeout=900)
        log.close()
        text = (tmp_path / f"{name}.log").read_text(errors="replace")
        assert rc == 0, f"{name} exited {rc}:\n{text[-3000:]}"
        assert "GDN layers run on gdn_graphs kernels" in text, name
        if name in full_graphs:
            assert "Capturing CUDA graphs (decode, FULL)" in text, name
    spec = importlib.util.spec_from_file_location("vllm_report", root / "profiling" / "vllm_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report.load(tmp_path), report
