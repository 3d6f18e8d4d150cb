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
# their MTP draft models (attention only; vLLM's refuse mode "all" while they build)
DRAFT_CLASSES = {
    "Qwen3NextMTP": "gdn_graphs.vllm.v0_26.model:Qwen3NextMTPAll",
    "Qwen3_5MTP": "gdn_graphs.vllm.v0_26.qwen3_5_mtp:Qwen3_5MTPAll",
    "Qwen3_5MoeMTP": "gdn_graphs.vllm.v0_26.qwen3_5_mtp:Qwen3_5MoeMTPAll",
}

# vLLM's own MODELS_CONFIG_MAP entries for these architectures (Qwen3.5's reads the state dtype
# from the checkpoint's config): ours replaces them in the map and runs them first
_VLLM_CONFIG_HOOKS: dict[str, type] = {}


def register() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    # our KV-cache spec and its manager, in every process: the engine core builds the manager
    # from specs that the workers' layers made
    import gdn_graphs.vllm.v0_26.state_pages  # noqa: F401  (registers on import)
    import gdn_graphs.vllm.v0_26.spec_pages  # noqa: F401  (likewise, with speculative decoding)
    # prefill chunks ending on multiples of 64 (the engine core builds the scheduler)
    from gdn_graphs.vllm.v0_26.schedule import install as install_chunk_alignment

    install_chunk_alignment()

    for arch, cls in MODEL_CLASSES.items():
        ModelRegistry.register_model(arch, cls)
        prev = MODELS_CONFIG_MAP.get(arch)
        if prev is not None and prev is not GDNAllConfig:
            _VLLM_CONFIG_HOOKS[arch] = prev
        MODELS_CONFIG_MAP[arch] = GDNAllConfig
    for arch, cls in DRAFT_CLASSES.items():
        ModelRegistry.register_model(arch, cls)


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
            check_speculative(vllm_config)
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


# speculative methods the plugin runs (vLLM 0.26 renames the Qwen MTP ones to "mtp")
# ("ngram_gpu": vLLM's n-gram drafter on the device, the n-gram it runs with async scheduling;
# "eagle3": a separate draft head on the target's auxiliary hidden states, which vLLM's
# Qwen3-Next and Qwen3.5 classes provide (SupportsEagle3) and our subclasses inherit). The GDN
# layers see the same verification rows whatever drafts them; the methods differ for the page
# manager only in vLLM's drop_eagle_block (EAGLE-3 and MTP), which it applies in both modes.
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
SPEC_METHODS = ("ngram", "ngram_gpu", "eagle3", *MTP_METHODS)
_OFF = "or turn the plugin off for this engine with additional_config={'gdn_graphs': False}"


def check_speculative(vllm_config) -> None:
    """Speculative decoding with the plugin: which settings it runs, one clear error for the rest
    (README "With vLLM"). Async scheduling is left to vLLM (it turns it on for MTP and
    ngram_gpu where its executor can): with it the host's computed tokens of a row after a step
    with drafts are optimistic, and the builder places the spec rows from the device's
    (``gdn_graphs.vllm.spec_placement``; run on an H200 with ngram_gpu k=3 and MTP k=2)."""
    sc, cc = vllm_config.speculative_config, vllm_config.cache_config
    method, k = getattr(sc, "method", None), getattr(sc, "num_speculative_tokens", None)
    if method not in SPEC_METHODS:
        raise ValueError(f"gdn_graphs runs speculative decoding with method 'ngram', "
                         f"'ngram_gpu', 'eagle3' or the MTP methods {MTP_METHODS}; got "
                         f"method={method!r}. Use one of them, "
                         f"{_OFF}")
    if not isinstance(k, int) or not 1 <= k < CHUNK:
        raise ValueError(f"gdn_graphs needs num_speculative_tokens in [1, {CHUNK - 1}] (1 + k "
                         f"tokens per row within a block), got {k!r}; change it, {_OFF}")
    if getattr(sc, "parallel_drafting", False):
        raise ValueError(f"gdn_graphs does not run parallel_drafting (rows of 1 + 2k tokens); "
                         f"leave it off, {_OFF}")
    if not cc.enable_prefix_caching:
        raise ValueError(f"gdn_graphs runs speculative decoding with prefix caching on (mamba "
                         f"cache mode 'all', whose pages hold the states after every draft); "
                         f"enable_prefix_caching=False gives one page per request. Turn prefix "
                         f"caching on, {_OFF}")
    logger.info("gdn_graphs: speculative decoding, method %r, k=%d (lookahead layout)", method, k)
