"""vLLM 0.26: Qwen3.5's MTP draft models (dense and MoE), built in an engine whose GDN layers
run mode "all" on gdn_graphs (``model.all_mode_draft``). A module of its own, like ``qwen3_5``:
vLLM's Qwen3.5 MTP imports its Qwen3.5 model, which needs torchvision."""

from __future__ import annotations

from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MoeMTP, Qwen3_5MTP

from gdn_graphs.vllm.v0_26.model import all_mode_draft

Qwen3_5MTPAll = all_mode_draft(Qwen3_5MTP)
Qwen3_5MoeMTPAll = all_mode_draft(Qwen3_5MoeMTP)
