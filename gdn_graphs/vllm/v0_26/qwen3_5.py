"""vLLM 0.26: Qwen3.5 model classes (dense and MoE) with Mamba prefix caching at every block.

A module of its own: vLLM's Qwen3.5 is a vision-language model whose import needs torchvision, so
only engines that serve Qwen3.5 import it. The layers, builder and config hook are Qwen3-Next's
(``_v026_layer``, ``_v026``): vLLM builds Qwen3.5's GDN layers from the same class.
"""

from __future__ import annotations

from typing import ClassVar

from vllm.model_executor.models.qwen3_5 import (Qwen3_5ForConditionalGeneration,
                                                Qwen3_5MoeForConditionalGeneration)

from gdn_graphs.vllm.v0_26.model import built_in_align_mode, switch_on_layers


class Qwen3_5AllForConditionalGeneration(Qwen3_5ForConditionalGeneration):
    """Qwen3.5 (dense) with Mamba prefix caching at every block (gdn_graphs implements "all")."""

    supports_mamba_prefix_caching: ClassVar = True

    def __init__(self, *, vllm_config, prefix: str = "model"):
        with built_in_align_mode(vllm_config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        switch_on_layers(self, vllm_config)


class Qwen3_5MoeAllForConditionalGeneration(Qwen3_5MoeForConditionalGeneration):
    """Qwen3.5 MoE with Mamba prefix caching at every block."""

    supports_mamba_prefix_caching: ClassVar = True

    def __init__(self, *, vllm_config, prefix: str = "model"):
        with built_in_align_mode(vllm_config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        switch_on_layers(self, vllm_config)
