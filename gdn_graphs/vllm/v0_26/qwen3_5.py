"""vLLM 0.26: Qwen3.5 model classes (dense and MoE) with Mamba prefix caching at every block.

A module of its own: vLLM's Qwen3.5 is a vision-language model whose import needs torchvision, so
only engines that serve Qwen3.5 import it. The layers, builder and config hook are Qwen3-Next's
(``model``, ``config``): vLLM builds Qwen3.5's GDN layers from the same class.
"""

from __future__ import annotations

from vllm.model_executor.models.qwen3_5 import (Qwen3_5ForConditionalGeneration,
                                                Qwen3_5MoeForConditionalGeneration)

from gdn_graphs.vllm.v0_26.model import all_mode_model

# vLLM's Qwen3.5 classes default to prefix "model"
Qwen3_5AllForConditionalGeneration = all_mode_model(Qwen3_5ForConditionalGeneration, "model")
Qwen3_5MoeAllForConditionalGeneration = all_mode_model(Qwen3_5MoeForConditionalGeneration, "model")
