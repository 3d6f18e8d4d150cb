"""What several test modules share: error measures, bit comparison, pools with guard slots, and a
CPU stand-in for CUDA graphs."""

from __future__ import annotations

import contextlib

import torch

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool of random values inside a buffer with one NaN guard slot before and after it; ``pad``
    extra elements per slot give a slot stride larger than a state (vLLM pads its pages).
    Returns (buffer, pool): a kernel that writes outside the pool changes a guard."""
    n = 1
    for d in slot_shape:
        n *= d
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(num_slots + 2, n + pad, generator=gen).to(dtype).to(device)
    buf[0] = float("nan")
    buf[-1] = float("nan")
    return buf, buf[1:-1, :n].unflatten(1, slot_shape)


class RerunBackend:
    """CPU stand-in for CUDA graphs (GraphManager's backend): a replay re-runs the captured
    ``fn(size)`` and copies its result into the graph's static outputs, which is what a replay
    means to the caller. Set ``manager`` (the GraphManager) and ``fn`` after capture."""

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
        new = self.fn(key.size)
        if isinstance(new, torch.Tensor):
            entry.outputs.copy_(new)
        else:
            for dst, src in zip(entry.outputs, new):
                dst.copy_(src)
        self.replays += 1

    def synchronize(self):
        pass
