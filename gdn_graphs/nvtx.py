"""NVTX ranges that cost (almost) nothing when profiling is off.

    from gdn_graphs import nvtx
    nvtx.enable(True)                 # explicit switch, no environment variable
    with nvtx.range("gdn.plan"):      # context manager ...
        ...
    @nvtx.range("gdn.step")           # ... or decorator (the flag is read at call time)
    def step(): ...

Off (the default), entering a range is one attribute read and a branch. On, ranges go to the
``nvtx`` package when it is importable, else to ``torch.cuda.nvtx``; ``enable(True, backend=obj)``
takes any object with ``push(name)`` / ``pop()`` instead (tests, or torch.profiler bridges).

Ranges are host-side markers: they never synchronise, so they are harmless inside a region that is
being captured into a CUDA graph (they just do not appear on replay).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["enable", "enabled", "range"]

_enabled = False
_backend: Any = None


class _NvtxPackage:
    """The ``nvtx`` package (pip install nvtx): cheaper than torch's binding, supports domains."""

    def __init__(self, mod):
        self._push, self._pop = mod.push_range, mod.pop_range

    def push(self, name: str) -> None:
        self._push(name)

    def pop(self) -> None:
        self._pop()


class _TorchNvtx:
    def __init__(self):
        import torch

        if torch.version.cuda is None:
            raise RuntimeError("nvtx: neither the `nvtx` package nor a CUDA build of torch is available")
        self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def push(self, name: str) -> None:
        self._push(name)

    def pop(self) -> None:
        self._pop()


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

    __slots__ = ("name", "_pushed")

    def __init__(self, name: str):
        self.name = name
        self._pushed = False

    def __enter__(self) -> "range":
        if _enabled:
            _backend.push(self.name)
            self._pushed = True
        return self

    def __exit__(self, *exc) -> None:
        # Pop only what we pushed, so enable()/disable() between enter and exit stays balanced.
        if self._pushed:
            self._pushed = False
            _backend.pop()

    def __call__(self, fn: Callable) -> Callable:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _enabled:
                return fn(*args, **kwargs)
            backend = _backend
            backend.push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                backend.pop()

        return wrapper
