"""The embedded engine: a small hybrid GDN model, a scheduler with prefix caching at every block
boundary, and the ``gdn-graphs`` command line. It uses the runtime as any other engine would.

The names below load on first use: the command line must set up the Triton interpreter (on a
machine without a GPU) before any kernel module is imported, and it lives in this package.
"""

from importlib import import_module

_EXPORTS = {"Engine": "engine", "MODES": "request", "EngineConfig": "request",
            "Request": "request", "mode_available": "request", "HybridGDNModel": "model",
            "ModelConfig": "model", "preset": "model"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
