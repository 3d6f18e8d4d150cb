"""FULL CUDA-graph capture and replay: buckets, one shared memory pool, padding, eager fallback.

The manager owns no buffers. It captures a callable ``fn(size)`` that reads only persistent buffers
(the planner's, the model's weights and state pools) and allocates nothing it needs to outlive the
step except its outputs, which are kept as the graph's static outputs. Per kind of step ("decode",
...) it captures one graph per bucket size:

* buckets sorted ascending and deduplicated; a batch of n rows runs in the smallest bucket >= n
  (bisect), so the caller plans with padding to ``padded_size(kind, n)`` before ``run()``;
* capture goes largest bucket first, after ``warmup`` eager runs on the capture stream, into ONE
  memory pool shared by every graph of the manager: smaller graphs reuse the larger ones' memory;
* a batch above the largest bucket (or a kind never captured) runs ``fn(n)`` eagerly and warns
  once per kind;
* ``debug_ptrs=True`` records the ``data_ptr()`` of every tensor ``inputs()`` returns at capture
  and checks them before each replay: a reallocated buffer would otherwise be read stale, silently.

All CUDA calls go through ``backend`` (default ``TorchCudaBackend``), so the logic is testable
without a GPU.
"""

from __future__ import annotations

import bisect
import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from gdn_graphs import nvtx

__all__ = ["GraphKey", "GraphManager", "GraphStats", "CapturedGraph", "TorchCudaBackend",
           "EagerFallbackWarning"]


class EagerFallbackWarning(RuntimeWarning):
    """A step ran eagerly because no captured graph fits it (emitted once per kind)."""


@dataclass(frozen=True)
class GraphKey:
    kind: str
    size: int


@dataclass
class CapturedGraph:
    graph: Any                                # torch.cuda.CUDAGraph (or the backend's object)
    outputs: Any                              # fn(size)'s return value at capture: static outputs
    input_ptrs: tuple[int, ...] | None        # data_ptr()s of inputs() at capture (debug_ptrs)
    range_name: str                           # NVTX range of its replay (payload: its size)


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    replays_by_key: Counter = field(default_factory=Counter)
    eager_by_kind: Counter = field(default_factory=Counter)


class TorchCudaBackend:
    """The CUDA calls the manager makes, via torch.cuda."""

    def pool_handle(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def new_stream(self) -> Any:
        return torch.cuda.Stream()

    def new_graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    @contextlib.contextmanager
    def warmup_context(self, stream) -> Iterator[None]:
        """Run the enclosed work on ``stream`` (the capture stream), ordered after the current
        stream's work and before anything the current stream does afterwards."""
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    @contextlib.contextmanager
    def capture_context(self, graph, pool, stream) -> Iterator[None]:
        """Capture into ``pool`` on ``stream`` (torch.cuda.graph synchronises and empties the
        caching allocator's free blocks first).

        cuBLAS keeps one workspace per handle and stream, made on first use: the warm-up on the
        capture stream makes it in ordinary memory, and a graph captured after that bakes in its
        address. Whoever clears cuBLAS workspaces later (Inductor's cudagraph trees do, before
        and after each of their captures: the piecewise mode) frees that memory while our graph
        still writes to it. Clearing them here, before and after, makes cuBLAS allocate the
        workspace this graph uses inside the graph's own pool, as cudagraph trees do for theirs.
        (Suspected cause of the intermittent illegal access in full mode, bf16, 36 layers, after
        piecewise steps: profiling/results/2026-12-01/SUMMARY.md.)"""
        torch._C._cuda_clearCublasWorkspaces()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                yield
        finally:
            torch._C._cuda_clearCublasWorkspaces()

    def replay(self, graph) -> None:
        graph.replay()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def _progress(sizes: list[int], kind: str, enabled: bool):
    if not enabled:
        return sizes
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return sizes
    return tqdm(sizes, desc=f"capturing {kind} graphs", unit="graph", leave=False)


class GraphManager:
    """Capture/replay of FULL CUDA graphs per (kind, bucket size); see the module docstring."""

    def __init__(self, buckets: Sequence[int], *, debug_ptrs: bool = False, backend: Any = None):
        sizes = list(buckets)
        for b in sizes:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"bucket sizes must be positive ints, got {b!r}")
        self.buckets: tuple[int, ...] = tuple(sorted(set(sizes)))
        self.debug_ptrs = debug_ptrs
        self.backend = backend if backend is not None else TorchCudaBackend()
        self.captured: dict[GraphKey, CapturedGraph] = {}
        self.stats = GraphStats()
        self._inputs: dict[GraphKey, Callable[[], Sequence[torch.Tensor]]] = {}
        self._warned: set[str] = set()
        self._pool: Any = None
        self._stream: Any = None

    # ------------------------------------------------------------------ sizes

    @property
    def max_bucket(self) -> int | None:
        return self.buckets[-1] if self.buckets else None

    def bucket_for(self, n: int) -> int | None:
        """Smallest bucket >= n, or None above the largest."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def is_captured(self, kind: str) -> bool:
        return any(k.kind == kind for k in self.captured)

    def padded_size(self, kind: str, n: int) -> int:
        """Rows the caller must plan (pad to) before ``run(kind, n, ...)``: the graph's bucket, or
        n itself when the step will run eagerly."""
        size = self.bucket_for(n)
        if size is None or GraphKey(kind, size) not in self.captured:
            return n
        return size

    # ------------------------------------------------------------------ capture

    def capture(self, kind: str, fn: Callable[[int], Any], *,
                inputs: Callable[[], Sequence[torch.Tensor]] | None = None,
                warmup: int = 2, progress: bool = True) -> None:
        """Capture ``fn(size)`` for every bucket not yet captured for ``kind``, largest first.

        fn(size) must be graph-safe (no sync, no allocation that must persist besides its outputs,
        no Python branch on tensor values) and read only persistent buffers. Its return value at
        capture becomes the graph's static outputs, returned by every replay. inputs(): the tensors
        the graph reads, for the debug_ptrs guard. Buckets already captured for ``kind`` are kept
        as they are (a graph is captured once).
        """
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        todo = [s for s in reversed(self.buckets) if GraphKey(kind, s) not in self.captured]
        if not todo:
            return
        be = self.backend
        if self._pool is None:
            self._pool = be.pool_handle()
        if self._stream is None:
            self._stream = be.new_stream()
        name = f"gdn.capture.{kind}"
        be.synchronize()
        for size in _progress(todo, kind, progress):
            key = GraphKey(kind, size)
            with nvtx.range(name, size):
                with be.warmup_context(self._stream):
                    for _ in range(warmup):
                        fn(size)
                ptrs = self._input_ptrs(key, inputs) if (self.debug_ptrs and inputs) else None
                graph = be.new_graph()
                with be.capture_context(graph, self._pool, self._stream):
                    outputs = fn(size)
            self.captured[key] = CapturedGraph(graph, outputs, ptrs, f"gdn.replay.{kind}")
            if inputs is not None:
                self._inputs[key] = inputs
            self.stats.captures += 1
        be.synchronize()

    @staticmethod
    def _input_ptrs(key: GraphKey, inputs: Callable[[], Sequence[torch.Tensor]]) -> tuple[int, ...]:
        ptrs = []
        for i, t in enumerate(inputs()):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"graph {key.kind}/{key.size}: inputs()[{i}] is not a tensor: {type(t)}")
            ptrs.append(t.data_ptr())
        return tuple(ptrs)

    def _check_ptrs(self, key: GraphKey, entry: CapturedGraph) -> None:
        now = self._input_ptrs(key, self._inputs[key])
        then = entry.input_ptrs
        if len(now) != len(then):
            raise RuntimeError(f"graph {key.kind}/{key.size}: inputs() returned {len(now)} tensors, "
                               f"{len(then)} at capture")
        for i, (a, b) in enumerate(zip(then, now)):
            if a != b:
                raise RuntimeError(
                    f"graph {key.kind}/{key.size}: input tensor {i} moved (data_ptr {a:#x} at capture, "
                    f"{b:#x} now); the graph would read the old memory. Persistent buffers must be "
                    f"updated in place (copy_), never reassigned")

    # ------------------------------------------------------------------ run

    def run(self, kind: str, n: int, fn: Callable[[int], Any]) -> tuple[Any, int]:
        """Replay the graph of ``bucket_for(n)`` (the caller planned with padding to that size) and
        return (its static outputs, size); or, with no graph that fits, run ``fn(n)`` eagerly and
        return (its outputs, n), warning once per kind."""
        size = self.bucket_for(n)
        key = GraphKey(kind, size) if size is not None else None
        entry = self.captured.get(key) if key is not None else None
        if entry is None:
            self._warn_eager(kind, n)
            self.stats.eager_fallbacks += 1
            self.stats.eager_by_kind[kind] += 1
            with nvtx.range(f"gdn.eager.{kind}", n):
                return fn(n), n
        if self.debug_ptrs and entry.input_ptrs is not None:
            self._check_ptrs(key, entry)
        with nvtx.range(entry.range_name, size):
            self.backend.replay(entry.graph)
        self.stats.replays += 1
        self.stats.replays_by_key[key] += 1
        return entry.outputs, size

    def _warn_eager(self, kind: str, n: int) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        if not self.is_captured(kind):
            why = f"no graphs were captured for kind {kind!r}"
        else:
            why = f"a batch of {n} is above the largest captured bucket ({self.max_bucket})"
        warnings.warn(f"gdn_graphs: {why}; running eagerly (warned once per kind)",
                      EagerFallbackWarning, stacklevel=3)

    def clear(self) -> None:
        """Drop every graph (and the pool's memory with them once outputs are released)."""
        self.captured.clear()
        self._inputs.clear()
        self._warned.clear()
        self._pool = None
