"""vLLM 0.26: the model class, layer, backend and metadata builder (the config hook and the
registration are in ``_v026``; docs/vllm_plan.md lists the vLLM source they rest on).

Imported by vLLM's processes when they resolve the model class (the registry entry that
``_v026.register`` makes points here), so importing it installs the layer swap too.

What it changes, for Qwen3-Next and Qwen3.5 (dense and MoE; ``ARCHS``):
* config: prefix caching on -> mamba cache mode "all" with a block size that is a multiple of 64
  (``GDNAllConfig``); prefix caching off -> vLLM's "none" (one state per request), still run by
  our kernels.
* model class: the same model, declaring Mamba prefix caching, with vLLM's refusal of "all"
  stepped around (``Qwen3NextAllForCausalLM``; Qwen3.5's are in ``_v026_qwen3_5``, because
  importing vLLM's Qwen3.5 needs torchvision, which a Qwen3-Next engine should not).
* layer: ``GDNGraphsQwenGDN`` replaces ``QwenGatedDeltaNetAttention``'s core (conv + recurrence)
  with gdn_graphs kernels that read/write vLLM's cache tensors in place, and names our backend.
* metadata: ``GDNGraphsBuilder`` plans each step into persistent buffers (FULL decode graphs read
  only those) and ``GDNGraphsMetadata`` carries them to the layers.
Everything falls through to vLLM's own code when the plugin is switched off for an engine
(``additional_config={"gdn_graphs": False}``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
from vllm.v1.attention.backend import (AttentionCGSupport, AttentionMetadataBuilder,
                                       CommonAttentionMetadata)
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID
from vllm.v1.kv_cache_interface import MambaSpec

from gdn_graphs.ops.chunk import ChunkWorkspace
from gdn_graphs.runtime.core import run_gdn_core
from gdn_graphs.vllm import enabled
from gdn_graphs.vllm.v0_26.config import ARCHS
from gdn_graphs.vllm.slots import DeviceTablePlanner, plan_block_size
from gdn_graphs.vllm.warmup import warm_up_kernels

logger = init_logger("vllm.gdn_graphs")


def _active(vllm_config) -> bool:
    """Our kernels run this engine's GDN layers: plugin on and a mode we implement."""
    return (enabled(vllm_config) and vllm_config.model_config.architecture in ARCHS
            and vllm_config.cache_config.mamba_cache_mode in ("all", "none"))


# ----------------------------------------------------------------------------------------- model

@contextmanager
def built_in_align_mode(vllm_config):
    """vLLM's Qwen3-Next and Qwen3.5 classes refuse mode "all" in ``__init__`` (nothing else
    there reads the mode): show them "align" while they build, then restore "all"."""
    cc = vllm_config.cache_config
    mode = cc.mamba_cache_mode
    if mode == "all" and enabled(vllm_config):
        cc.mamba_cache_mode = "align"
    try:
        yield
    finally:
        cc.mamba_cache_mode = mode


class Qwen3NextAllForCausalLM(Qwen3NextForCausalLM):
    """Qwen3-Next with Mamba prefix caching at every block (gdn_graphs implements "all")."""

    supports_mamba_prefix_caching: ClassVar = True

    def __init__(self, *, vllm_config, prefix: str = ""):
        with built_in_align_mode(vllm_config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        # The layers were built while the mode read "align": switch them on now that it is back.
        switch_on_layers(self, vllm_config)


def switch_on_layers(model: torch.nn.Module, vllm_config) -> int:
    """Route every GDN layer of ``model`` through gdn_graphs if this engine uses it; returns how
    many are on (logged: the engine's log says which kernels run)."""
    on = _active(vllm_config)
    layers = [m for m in model.modules() if isinstance(m, GDNGraphsQwenGDN)]
    for m in layers:
        m._gdn_graphs = on and m.activation in ("silu", "swish")
    n_on = sum(m._gdn_graphs for m in layers)
    logger.info("gdn_graphs: %d of %d GDN layers run on gdn_graphs kernels (mamba cache mode %r)",
                n_on, len(layers), vllm_config.cache_config.mamba_cache_mode)
    return n_on


# -------------------------------------------------------------------------------------- metadata

@dataclass
class GDNGraphsMetadata:
    num_decodes: int            # decode rows to launch (the bucket in a FULL-graph decode)
    num_prefill_tokens: int
    num_actual_tokens: int
    decode_read: torch.Tensor   # persistent int32 views (the builder's slot set)
    decode_write: torch.Tensor
    prefill: Any                # ChunkMeta of persistent views
    # fields vLLM's generic code may look at on any GDN metadata
    num_prefills: int = 0
    num_decode_tokens: int = 0
    num_spec_decodes: int = 0


class GDNGraphsBuilder(AttentionMetadataBuilder[GDNGraphsMetadata]):
    """Owns the persistent slot buffers of one KV-cache group and fills them each step."""

    _cudagraph_support: ClassVar = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold: int = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        assert isinstance(kv_cache_spec, MambaSpec)
        self._init_reorder_batch_threshold(1, False)
        cc, sc = vllm_config.cache_config, vllm_config.scheduler_config
        self.block_size = plan_block_size(kv_cache_spec.block_size, cc.mamba_cache_mode == "all")
        # rows: a CUDA-graph bucket may pad a decode batch past max_num_seqs
        self.max_reqs = max(sc.max_num_seqs,
                            vllm_config.compilation_config.max_cudagraph_capture_size or 0)
        self.max_tokens = sc.max_num_batched_tokens
        self._planner = self._slots = None  # sized by the first block table this builder sees

    def _slots_for(self, bt: torch.Tensor):
        """This group's slot buffers, on the planner shared by every GDN group of the engine (the
        groups' tables have one shape, so one host plan per step serves them all)."""
        if self._slots is None:
            stride = bt.stride(0) if bt.shape[0] > 1 else bt.shape[1]
            key = (max(self.max_reqs, bt.shape[0]), self.max_tokens, self.block_size, stride,
                   bt.shape[1], str(bt.device))
            planner = _PLANNERS.get(key)
            if planner is None:
                planner = _PLANNERS[key] = DeviceTablePlanner(
                    key[0], self.max_tokens, self.block_size, stride, bt.shape[1],
                    null_block=NULL_BLOCK_ID, device=bt.device)
            self._planner, self._slots = planner, planner.new_slots()
        return self._planner, self._slots

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False, **_: Any) -> GDNGraphsMetadata:
        m = common_attn_metadata
        qsl = m.query_start_loc_cpu.numpy()
        # seq_lens - query lens: exact without speculative decoding (which the config refuses),
        # and right for vLLM's dummy batches too (its computed-token counts there are stale)
        seq_lens = m._seq_lens_cpu if m._seq_lens_cpu is not None else m.seq_lens_cpu_upper_bound
        n = seq_lens.numpy()[:len(qsl) - 1] - (qsl[1:] - qsl[:-1])
        planner, slots = self._slots_for(m.block_table_tensor)
        layout = planner.plan(qsl, n, m.block_table_tensor, pad_decodes_to=m.num_reqs, slots=slots)
        return GDNGraphsMetadata(num_decodes=layout.num_decodes,
                                 num_prefill_tokens=layout.num_prefill_tokens,
                                 num_actual_tokens=m.num_actual_tokens,
                                 decode_read=slots.decode_read, decode_write=slots.decode_write,
                                 prefill=slots.prefill, num_prefills=layout.plan.num_prefills,
                                 num_decode_tokens=layout.num_decodes)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        md = self.build(0, common_attn_metadata)
        self._slots.clear_decode_slots()  # the dummy batch must not touch any block
        return md


# one placeholder planner per table shape and device, shared by the GDN groups' builders
_PLANNERS: dict[tuple, DeviceTablePlanner] = {}


class GDNGraphsBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return GDNGraphsBuilder


# ----------------------------------------------------------------------------------------- layer

_WORKSPACES: dict[tuple, ChunkWorkspace] = {}


def _workspace(max_tokens, HV, K, V, HK, dtype, device) -> ChunkWorkspace:
    """One chunk-kernel scratch per (shape, device), shared by every layer. Made during vLLM's
    profile run, so the memory profiler counts it before the KV cache takes the rest."""
    key = (max_tokens, HV, K, V, HK, dtype, str(device))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = ChunkWorkspace(max_tokens, HV, K, V, dtype, device, HK=HK)
    return ws


class GDNGraphsQwenGDN(QwenGatedDeltaNetAttention):
    """vLLM's Qwen GDN layer with its conv + recurrence run by gdn_graphs (projections, norm,
    weight loading and vLLM's opaque custom op are vLLM's)."""

    def __init__(self, config, vllm_config, *args, **kwargs):
        super().__init__(config, vllm_config, *args, **kwargs)
        self._gdn_graphs = False  # set by the model class once the cache mode is known
        self._max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self._max_reqs = vllm_config.scheduler_config.max_num_seqs
        self._cache_config = vllm_config.cache_config  # its page size is final by the profile run

    def get_attn_backend(self):
        return GDNGraphsBackend if self._gdn_graphs else super().get_attn_backend()

    def _ws(self, like: torch.Tensor) -> ChunkWorkspace:
        tp = self.tp_size
        return _workspace(self._max_tokens, self.num_v_heads // tp, self.head_k_dim,
                          self.head_v_dim, self.num_k_heads // tp, like.dtype, like.device)

    def _warm_up(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """Compile on this engine's layouts: the inputs of vLLM's dummy forward, pools laid out
        like its pages (see warmup.py)."""
        ws = self._ws(mixed_qkv)
        w = self.conv1d.weight
        tp = self.tp_size
        try:
            warm_up_kernels(self.num_k_heads // tp, self.num_v_heads // tp, self.head_k_dim,
                            self.head_v_dim, w.view(w.size(0), w.size(-1)), self.A_log,
                            self.dt_bias, mixed_qkv.dtype, self.get_state_dtype()[1], ws,
                            like=(mixed_qkv, a, b),
                            page_bytes=self._cache_config.mamba_page_size_padded,
                            conv_dim_first=is_conv_state_dim_first(),
                            max_decode_rows=self._max_reqs)
        except Exception:  # the first request then compiles them; never fail the engine here
            logger.warning("gdn_graphs: kernel warm-up failed", exc_info=True)

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        if not self._gdn_graphs:
            return super()._forward_core(mixed_qkv, b, a, core_attn_out)
        if a.stride(-1) != 1:
            a = a.contiguous()
        if b.stride(-1) != 1:
            b = b.contiguous()
        md = get_forward_context().attn_metadata
        if md is None:  # vLLM's profile run: no cache yet; allocate what we keep, compile kernels
            self._warm_up(mixed_qkv, a, b)
            return
        md = md[self.prefix]
        conv, ssm = self.kv_cache[0], self.kv_cache[1]
        if not is_conv_state_dim_first():
            conv = conv.transpose(-1, -2)  # [blocks, conv_dim, W-1], a strided view: no copy
        w = self.conv1d.weight
        w = w.view(w.size(0), w.size(-1))
        ws = self._ws(mixed_qkv) if md.num_prefill_tokens else None
        run_gdn_core(mixed_qkv, a, b, w, self.conv1d.bias, self.A_log, self.dt_bias, conv, ssm,
                     core_attn_out, md.num_decodes, md.num_prefill_tokens, md.decode_read,
                     md.decode_write, md.prefill, ws)


def install_layer() -> None:
    """Swap vLLM's Qwen GDN layer for ours at instantiation (idempotent)."""
    from vllm.model_executor.custom_op import op_registry_oot
    if op_registry_oot.get("QwenGatedDeltaNetAttention") is not GDNGraphsQwenGDN:
        op_registry_oot.pop("QwenGatedDeltaNetAttention", None)
        QwenGatedDeltaNetAttention.register_oot(GDNGraphsQwenGDN)


install_layer()
