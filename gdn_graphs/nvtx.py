"""NVTX ranges that cost (almost) nothing when profiling is off.

    from gdn_graphs import nvtx
    nvtx.enable(True)                      # explicit switch, no environment variable
    with nvtx.range("gdn.plan", rows):     # context manager, optional integer payload ...
        ...
    @nvtx.range("engine.step")             # ... or decorator (the flag is read at call time)
    def step(): ...

Off (the default), entering a range is one attribute read and a branch. On, ranges go to the
``nvtx`` package when it is importable (names in the default domain, the payload as NVTX's int64
payload), else to ``torch.cuda.nvtx`` (no payload); ``enable(True, backend=obj)`` takes any object
with ``push(name, payload)`` / ``pop()`` instead: ``ProfilerRanges`` puts the same ranges into a
torch.profiler trace, ``Tee`` sends them to two backends.

Range names are stable (a profiler groups and filters by them; numbers go in the payload). The
names, what each encloses and its payload:

    engine.step             one engine step (scheduling to sampling)          scheduled tokens
    engine.plan             host planning of the step (rows, tables, plan())  rows
    engine.forward.<mode>   the model forward: eager | piecewise | graph      tokens
    gdn.plan                GDNPlanner.plan: validation + staging + copy      rows
    gdn.plan.copy           its one host-to-device copy
    gdn.capture.<kind>      capturing one CUDA graph of a kind ("decode")     bucket size
    gdn.replay.<kind>       replaying it                                      bucket size
    gdn.eager.<kind>        a step above the largest bucket, run eagerly      rows
    gdn.core                one layer's GDN core (run_gdn_core)               layer index
    gdn.core.decode         its decode rows: conv_decode + gdn_decode         layer index
    gdn.core.prefill        its prefill tokens: conv_prefill + chunk kernels  layer index

Ranges are host-side markers: they never synchronise, so they are harmless inside a region that is
being captured into a CUDA graph (they just do not appear on replay; a replay's kernels sit inside
``gdn.replay.<kind>``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["enable", "enabled", "range", "ProfilerRanges", "Tee"]

_enabled = False
_backend: Any = None


class _NvtxPackage:
    """The ``nvtx`` package (pip install nvtx): cheaper than torch's binding, supports domains."""

    def __init__(self, mod):
        self._push, self._pop = mod.push_range, mod.pop_range

    def push(self, name: str, payload: int | None = None) -> None:
        self._push(name, payload=payload)

    def pop(self) -> None:
        self._pop()


class _TorchNvtx:
    def __init__(self):
        import torch

        if torch.version.cuda is None:
            raise RuntimeError("nvtx: neither the `nvtx` package nor a CUDA build of torch is available")
        self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def push(self, name: str, payload: int | None = None) -> None:
        self._push(name)  # torch's binding takes no payload

    def pop(self) -> None:
        self._pop()


class ProfilerRanges:
    """Ranges as torch.profiler ``record_function`` events (the payload in their ``args``); on a
    GPU the profiler also marks them on the device timeline, so kernels fall inside them."""

    def __init__(self):
        import torch

        self._rf = torch.autograd.profiler.record_function
        self._open: list = []

    def push(self, name: str, payload: int | None = None) -> None:
        rf = self._rf(name, None if payload is None else str(payload))
        rf.__enter__()
        self._open.append(rf)

    def pop(self) -> None:
        self._open.pop().__exit__(None, None, None)


class Tee:
    """Every range to two backends (e.g. NVTX for an external profiler and ProfilerRanges)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def push(self, name: str, payload: int | None = None) -> None:
        self.first.push(name, payload)
        self.second.push(name, payload)

    def pop(self) -> None:
        self.second.pop()
        self.first.pop()


def default_backend():
    """The ``nvtx`` package if importable, else ``torch.cuda.nvtx``."""
    return _default_backend()


def _default_backend():
    try:
        import nvtx as mod  # type: ignore[import-not-found]
    except ImportError:
        return _TorchNvtx()
    return _NvtxPackage(mod)


def enable(flag: bool = True, backend: Any = None) -> None:
    """Switch ranges on or off. ``backend``: an object with ``push(name)`` and ``pop()``; default:
    the ``nvtx`` package if importable, else ``torch.cuda.nvtx`` (RuntimeError if neither works)."""
    global _enabled, _backend
    if flag:
        _backend = backend if backend is not None else _default_backend()
    _enabled = bool(flag)


def enabled() -> bool:
    return _enabled


class range:  # noqa: N801 - reads as nvtx.range(...)
    """A named NVTX range: ``with nvtx.range(name):`` or ``@nvtx.range(name)``.

    As a context manager an instance is single-use (make a new one per ``with``, as above); as a
    decorator it is reentrant and thread-safe (each call opens its own range).
    """

    __slots__ = ("name", "payload", "_pushed")

    def __init__(self, name: str, payload: int | None = None):
        self.name = name
        self.payload = payload
        self._pushed = False

    def __enter__(self) -> "range":
        if _enabled:
            _backend.push(self.name, self.payload)
            self._pushed = True
        return self

    def __exit__(self, *exc) -> None:
        # Pop only what we pushed, so enable()/disable() between enter and exit stays balanced.
        if self._pushed:
            self._pushed = False
            _backend.pop()

    def __call__(self, fn: Callable) -> Callable:
        name, payload = self.name, self.payload

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _enabled:
                return fn(*args, **kwargs)
            backend = _backend
            backend.push(name, payload)
            try:
                return fn(*args, **kwargs)
            finally:
                backend.pop()

        return wrapper
