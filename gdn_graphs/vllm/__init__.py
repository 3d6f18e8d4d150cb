"""vLLM plugin: GDN prefix caching at every block boundary, with FULL CUDA-graph decode.

Installed with gdn_graphs as the ``vllm.general_plugins`` entry point ``gdn_graphs``, which vLLM
runs in each of its processes. For the supported architectures (Qwen3-Next, Qwen3.5) it sets vLLM's Mamba
cache mode to "all" with a block size that is a multiple of 64 and runs the GDN layers' conv and
recurrence with gdn_graphs kernels on vLLM's own cache tensors.

Turning it off:
* for one engine: ``LLM(..., additional_config={"gdn_graphs": False})`` (vLLM's own GDN path and
  its "align" prefix caching); a dict there instead keeps it on with options
  (``{"gdn_graphs": {"keep_states": "all" | "ends" | N, "stats_every": steps}}``);
* for a process: ``VLLM_PLUGINS`` is vLLM's allow-list of plugins; leave ``gdn_graphs`` out of it.
"""

from __future__ import annotations

import logging

__all__ = ["SUPPORTED_VLLM", "register", "enabled"]

# vLLM versions whose hooks live in this package (one module per version line).
SUPPORTED_VLLM = {"0.26.": "gdn_graphs.vllm.v0_26"}

# under "vllm." so that vLLM's own log handler prints our lines in its processes
_log = logging.getLogger("vllm.gdn_graphs")
_registered = False


def enabled(vllm_config) -> bool:
    """The per-engine switch: ``additional_config={"gdn_graphs": False}`` turns the plugin off."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    return not (isinstance(extra, dict) and extra.get("gdn_graphs", True) is False)


def hooks_module(version: str) -> str | None:
    for prefix, module in SUPPORTED_VLLM.items():
        if version.startswith(prefix):
            return module
    return None


def register() -> bool:
    """The entry point. Registers the model class and config hook for this vLLM version; with an
    unsupported version it says so once and changes nothing. Returns whether it registered."""
    global _registered
    if _registered:
        return True
    import vllm

    version = getattr(vllm, "__version__", "?")
    module = hooks_module(version)
    if module is None:
        _log.error("gdn_graphs: vLLM %s is not supported (supported: %s); the plugin does nothing "
                   "and vLLM runs as it is", version, ", ".join(p + "x" for p in SUPPORTED_VLLM))
        return False
    import importlib

    importlib.import_module(module).register()
    _registered = True
    _log.info("gdn_graphs: registered for vLLM %s", version)
    return True
