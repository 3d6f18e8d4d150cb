"""vLLM 0.26: registration and the config hook (light: imported in every vLLM process by the
plugin entry point; ``model`` is imported only where vLLM builds the model)."""

from __future__ import annotations

import logging

from vllm.model_executor.models.config import VerifyAndUpdateConfig

from gdn_graphs.constants import CHUNK
from gdn_graphs.vllm import enabled

logger = logging.getLogger("vllm.gdn_graphs")

# vLLM architecture -> our model class (the same model, declaring Mamba prefix caching)
MODEL_CLASSES = {
    "Qwen3NextForCausalLM": "gdn_graphs.vllm.v0_26.model:Qwen3NextAllForCausalLM",
    "Qwen3_5ForConditionalGeneration": "gdn_graphs.vllm.v0_26.qwen3_5:Qwen3_5AllForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration":
        "gdn_graphs.vllm.v0_26.qwen3_5:Qwen3_5MoeAllForConditionalGeneration",
}
ARCHS = tuple(MODEL_CLASSES)

# vLLM's own MODELS_CONFIG_MAP entries for these architectures (Qwen3.5's reads the state dtype
# from the checkpoint's config): ours replaces them in the map and runs them first
_VLLM_CONFIG_HOOKS: dict[str, type] = {}


def register() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    # our KV-cache spec and its manager, in every process: the engine core builds the manager
    # from specs that the workers' layers made
    import gdn_graphs.vllm.v0_26.state_pages  # noqa: F401  (registers on import)
    # prefill chunks ending on multiples of 64 (the engine core builds the scheduler)
    from gdn_graphs.vllm.v0_26.schedule import install as install_chunk_alignment

    install_chunk_alignment()

    for arch, cls in MODEL_CLASSES.items():
        ModelRegistry.register_model(arch, cls)
        prev = MODELS_CONFIG_MAP.get(arch)
        if prev is not None and prev is not GDNAllConfig:
            _VLLM_CONFIG_HOOKS[arch] = prev
        MODELS_CONFIG_MAP[arch] = GDNAllConfig


class GDNAllConfig(VerifyAndUpdateConfig):
    """``MODELS_CONFIG_MAP`` entry: runs before vLLM's MambaModelConfig picks the cache mode."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        prev = _VLLM_CONFIG_HOOKS.get(vllm_config.model_config.architecture)
        if prev is not None:
            prev.verify_and_update_config(vllm_config)
        cc = vllm_config.cache_config
        if not enabled(vllm_config):
            # our model class declares prefix-caching support; keep vLLM's own choice when off
            if cc.enable_prefix_caching and cc.mamba_cache_mode in ("none", "all"):
                cc.mamba_cache_mode = "align"
            return
        if vllm_config.speculative_config is not None:
            raise ValueError("gdn_graphs does not support speculative decoding yet; turn the plugin "
                             "off for this engine with additional_config={'gdn_graphs': False}")
        if not cc.enable_prefix_caching:
            return  # "none": one state per request, run by our kernels in place
        if cc.mamba_cache_mode not in ("none", "all"):
            raise ValueError(f"gdn_graphs keeps a state at every block boundary (mamba cache mode "
                             f"'all'); got mamba_cache_mode={cc.mamba_cache_mode!r}. Drop it, or "
                             f"turn the plugin off with additional_config={{'gdn_graphs': False}}")
        cc.mamba_cache_mode = "all"
        if cc.mamba_block_size is None:
            # vLLM then uses lcm(64, attention block alignment) scaled to fit the state page
            cc.mamba_block_size = CHUNK
            cc.user_specified_mamba_block_size = True
        elif cc.mamba_block_size % CHUNK:
            raise ValueError(f"gdn_graphs needs mamba_block_size to be a multiple of {CHUNK}, got "
                             f"{cc.mamba_block_size}")
        # A finer unit lets vLLM's Mamba manager return hits inside a block, where no state is
        # stored; the block size is only fixed later (by the attention backend), so any explicit
        # unit is refused rather than compared with it.
        unit = getattr(cc, "prefix_match_unit", None)
        if unit is not None:
            raise ValueError(f"gdn_graphs reuses prefixes at whole blocks; prefix_match_unit={unit} "
                             f"would give cache hits inside a block, where no GDN state is stored. "
                             f"Leave it unset, or turn the plugin off with "
                             f"additional_config={{'gdn_graphs': False}}")
        logger.info("gdn_graphs: mamba cache mode 'all' (a GDN state at every block boundary)")


