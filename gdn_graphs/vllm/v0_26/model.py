"""vLLM 0.26: the model classes, the GDN layer, the attention backend and metadata builder.

Imported by vLLM's processes when they resolve the model class (the registry entry that
``config.register`` makes points here), so importing it installs the layer swap too. Every vLLM
internal this module relies on is listed in the package docstring (``gdn_graphs.vllm.v0_26``).
Everything falls through to vLLM's own code when the plugin is switched off for an engine.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
from vllm.model_executor.models.qwen3_next_mtp import Qwen3NextMTP
from vllm.v1.attention.backend import (AttentionCGSupport, AttentionMetadataBuilder,
                                       CommonAttentionMetadata)
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID
from vllm.v1.kv_cache_interface import MambaSpec

from gdn_graphs import nvtx
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.runtime.step import GDNStep
from gdn_graphs.vllm import enabled
from gdn_graphs.vllm.builder import GDNResources, StepBuilder, spec_lookahead
from gdn_graphs.vllm.slots import plan_block_size
from gdn_graphs.vllm.v0_26.config import ARCHS
from gdn_graphs.vllm.v0_26.pages import cache_views, kernel_conv_view
from gdn_graphs.vllm.v0_26.state_pages import prefill_option, state_spec
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


def all_mode_model(base: type, default_prefix: str) -> type:
    """``base`` (a vLLM model class) declaring Mamba prefix caching at every block: built while
    the mode reads "align", then its GDN layers switched on. vLLM's loader reads the ``prefix``
    parameter from the class signature and the classes differ in its default ("" for Qwen3-Next,
    "model" for Qwen3.5), hence a factory rather than one subclass."""

    def __init__(self, *, vllm_config, prefix: str = default_prefix):
        with built_in_align_mode(vllm_config):
            base.__init__(self, vllm_config=vllm_config, prefix=prefix)
        # The layers were built while the mode read "align": switch them on now that it is back.
        switch_on_layers(self, vllm_config)

    # vLLM's own name: it dispatches on ``model.__class__.__name__`` (seen: the MTP drafter's
    # load_model finds Qwen3.5's image token by it, and fails for any other name)
    name = base.__name__
    return type(name, (base,), {
        "__init__": __init__, "__module__": __name__,
        "__qualname__": name, "__doc__": f"{base.__name__} with a GDN state at every block "
                                         f"boundary (gdn_graphs implements mamba cache mode 'all').",
        "supports_mamba_prefix_caching": True})


Qwen3NextAllForCausalLM = all_mode_model(Qwen3NextForCausalLM, "")


def all_mode_draft(base: type) -> type:
    """``base`` (a vLLM MTP draft model: attention layers only, no GDN state) built while the
    mode reads "align": vLLM's Qwen MTP classes refuse mode "all" in ``__init__`` (nothing else
    there reads it), which the target model's GDN layers use with the plugin."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        with built_in_align_mode(vllm_config):
            base.__init__(self, vllm_config=vllm_config, prefix=prefix)

    name = base.__name__  # vLLM's own name, as in all_mode_model
    return type(name, (base,), {"__init__": __init__, "__module__": __name__,
                                "__qualname__": name, "__doc__": f"{base.__name__}, built in an "
                                f"engine whose GDN layers run mode 'all' on gdn_graphs."})


Qwen3NextMTPAll = all_mode_draft(Qwen3NextMTP)


def switch_on_layers(model: torch.nn.Module, vllm_config) -> int:
    """Route every GDN layer of ``model`` through gdn_graphs if this engine uses it, sharing one
    GDNResources; returns how many are on (logged: the engine's log says which kernels run)."""
    on = _active(vllm_config)
    resources = _new_resources(vllm_config)
    layers = [m for m in model.modules() if isinstance(m, GDNGraphsQwenGDN)]
    for m in layers:
        m._gdn_graphs = on and m.activation in ("silu", "swish")
        m._gdn_resources = resources
    n_on = sum(m._gdn_graphs for m in layers)
    if n_on and getattr(vllm_config.observability_config, "enable_layerwise_nvtx_tracing", False):
        # vLLM's layer-wise NVTX ranges are on: ours (gdn.core.* per layer) nest inside them
        try:
            nvtx.enable(True)
        except RuntimeError as e:  # no NVTX binding in this process
            logger.warning("gdn_graphs: NVTX ranges stay off: %s", e)
    logger.info("gdn_graphs: %d of %d GDN layers run on gdn_graphs kernels (mamba cache mode %r)",
                n_on, len(layers), vllm_config.cache_config.mamba_cache_mode)
    return n_on


# -------------------------------------------------------------------------------------- metadata

@dataclass
class GDNGraphsMetadata:
    step: GDNStep               # over the group's persistent slot buffers
    num_actual_tokens: int
    # fields vLLM's generic code may look at on any GDN metadata
    num_prefills: int = 0
    num_decodes: int = 0
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    num_spec_decodes: int = 0


class GDNGraphsBuilder(AttentionMetadataBuilder[GDNGraphsMetadata]):
    """One KV-cache group's builder: vLLM's metadata in, a GDNStep over persistent buffers out."""

    _cudagraph_support: ClassVar = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold: int = 1

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        # with speculation vLLM's decode graphs hold 1 + k tokens a row (uniform_decode_query_len)
        if vllm_config.speculative_config is not None:
            return AttentionCGSupport.UNIFORM_BATCH
        return cls._cudagraph_support

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        assert isinstance(kv_cache_spec, MambaSpec)
        k = _num_spec_tokens(vllm_config)
        # rows of up to 1 + k tokens first: vLLM's reorder, which the builder's spec rows rely on
        self._init_reorder_batch_threshold(1, k > 0)
        if k and kv_cache_spec.num_speculative_blocks != spec_lookahead(k):
            raise ValueError(f"gdn_graphs: speculative decoding with k={k} needs the GDN spec's "
                             f"{spec_lookahead(k)} lookahead columns, got "
                             f"{kv_cache_spec.num_speculative_blocks} (mode "
                             f"{vllm_config.cache_config.mamba_cache_mode!r}; prefix caching on?)")
        cc = vllm_config.cache_config
        block_size = plan_block_size(kv_cache_spec.block_size, cc.mamba_cache_mode == "all")
        width = kv_cache_spec.max_num_blocks_per_req(vllm_config,
                                                     vllm_config.model_config.max_model_len)
        self._steps = StepBuilder(_resources_of(vllm_config, layer_names), block_size, width,
                                  NULL_BLOCK_ID, device)
        # async scheduling with speculation: the host's seq_lens of a row whose previous step had
        # drafts count them all accepted; the device's are true (vLLM's model runner corrects
        # them there), and the spec rows' slots are placed from those (spec_placement)
        self._device_counts = bool(k and vllm_config.scheduler_config.async_scheduling)

    def _args(self, m: CommonAttentionMetadata):
        # seq_lens - query lens = tokens computed before the step: exact without async scheduling
        # (the scheduler has taken the rejected drafts back by then), optimistic for the spec
        # rows with it (the optimistic counts vLLM keeps on the host: seq_lens_cpu_upper_bound;
        # the device's seq_lens then place those rows), and right for vLLM's dummy batches too
        # (its computed-token counts there are stale)
        seq_lens = m._seq_lens_cpu if m._seq_lens_cpu is not None else m.seq_lens_cpu_upper_bound
        return m.query_start_loc_cpu.numpy(), seq_lens.numpy(), m.block_table_tensor, m.num_reqs

    def _device_seq_lens(self, m: CommonAttentionMetadata):
        return m.seq_lens if self._device_counts else None

    def _metadata(self, step: GDNStep, m: CommonAttentionMetadata) -> GDNGraphsMetadata:
        host = step.host
        return GDNGraphsMetadata(step=step, num_actual_tokens=m.num_actual_tokens,
                                 num_prefills=host.num_prefills, num_decodes=step.num_decodes,
                                 num_decode_tokens=step.num_decodes,
                                 num_prefill_tokens=step.num_prefill_tokens,
                                 num_spec_decodes=step.num_spec)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              num_accepted_tokens=None, num_decode_draft_tokens_cpu=None, fast_build: bool = False,
              **_: Any) -> GDNGraphsMetadata:
        # vLLM passes the draft counts to GDN builders (we are registered as one, install_layer);
        # the accepted counts are not needed: each row's computed tokens (the device's under
        # async scheduling) already say them
        m = common_attn_metadata
        drafts = (num_decode_draft_tokens_cpu.numpy()
                  if num_decode_draft_tokens_cpu is not None else None)
        args = self._args(m)
        counts = self._device_seq_lens(m)
        # vLLM builds the three GDN groups of a step on the same host inputs: the groups after
        # the first gather their table into the step already planned (same_inputs)
        inputs = _step_inputs(*args, drafts)
        planner = self._steps.planner
        step = planner.same_inputs(inputs, args[2], self._steps.slots, device_seq_lens=counts)
        if step is None:
            step = self._steps.build(*args, drafts=drafts, device_seq_lens=counts)
            planner.remember_inputs(inputs)
        return self._metadata(step, m)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        m = common_attn_metadata
        return self._metadata(self._steps.build_for_capture(*self._args(m)), m)


def _step_inputs(query_start_loc, seq_lens, block_table, num_reqs, drafts) -> tuple:
    """Everything StepBuilder.build computes its plan from, exactly (dtypes, lengths and bytes of
    the host arrays it reads, the row count), but the group's table."""
    rows = len(query_start_loc) - 1
    seq = seq_lens[:rows]
    d = None if drafts is None else np.asarray(drafts[:rows])
    return (query_start_loc.dtype.str, query_start_loc.tobytes(), seq.dtype.str, seq.tobytes(),
            None if d is None else (d.dtype.str, len(d), d.tobytes()), num_reqs)


def _resources_of(vllm_config, layer_names) -> GDNResources:
    """The model's GDNResources, from the first of the group's layers in vLLM's static forward
    context; a builder whose layers carry none (tests, a model not built by our classes) gets its
    own."""
    ctx = vllm_config.compilation_config.static_forward_context
    layer = ctx.get(layer_names[0]) if layer_names else None
    res = getattr(layer, "_gdn_resources", None)
    return res if res is not None else _new_resources(vllm_config)


def _num_spec_tokens(vllm_config) -> int:
    spec = vllm_config.speculative_config
    return (spec.num_speculative_tokens or 0) if spec is not None else 0


def _new_resources(vllm_config) -> GDNResources:
    sc = vllm_config.scheduler_config
    # rows: a CUDA-graph bucket may pad a decode batch past max_num_seqs
    capture = vllm_config.compilation_config.max_cudagraph_capture_size or 0
    return GDNResources(max_reqs=max(sc.max_num_seqs, capture),
                        max_tokens=sc.max_num_batched_tokens,
                        num_spec_tokens=_num_spec_tokens(vllm_config),
                        fi_prefill=prefill_option(vllm_config) == "flashinfer")


class GDNGraphsBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return GDNGraphsBuilder


# ----------------------------------------------------------------------------------------- layer

class GDNGraphsQwenGDN(QwenGatedDeltaNetAttention):
    """vLLM's Qwen GDN layer with its conv + recurrence run by gdn_graphs (projections, norm,
    weight loading and vLLM's opaque custom op are vLLM's)."""

    def __init__(self, config, vllm_config, *args, **kwargs):
        super().__init__(config, vllm_config, *args, **kwargs)
        self._gdn_graphs = False  # set by the model class once the cache mode is known
        self._gdn_resources: GDNResources | None = None  # likewise, shared by the model's layers
        self._max_reqs = vllm_config.scheduler_config.max_num_seqs
        self._cache_config = vllm_config.cache_config  # its page size is final by the profile run
        digits = [p for p in self.prefix.split(".") if p.isdigit()]
        self._layer_index = int(digits[-1]) if digits else -1  # NVTX payload only

    def get_attn_backend(self):
        return GDNGraphsBackend if self._gdn_graphs else super().get_attn_backend()

    def get_kv_cache_spec(self, vllm_config):
        """Mode "all" on our kernels: GDNStateSpec, which counts the one page a request needs
        and gets GDNStateManager, which keeps to it (state_pages.py)."""
        spec = super().get_kv_cache_spec(vllm_config)
        if self._gdn_graphs and isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "all":
            return state_spec(spec, vllm_config)
        return spec

    def _weights(self) -> GDNWeights:
        w = self.conv1d.weight
        return GDNWeights(w.view(w.size(0), w.size(-1)), self.conv1d.bias, self.A_log, self.dt_bias)

    def _heads(self) -> tuple[int, int]:
        return self.num_k_heads // self.tp_size, self.num_v_heads // self.tp_size

    def _workspace(self, like: torch.Tensor):
        HK, HV = self._heads()
        return self._gdn_resources.workspace(HV, self.head_k_dim, self.head_v_dim, HK, like.dtype,
                                             like.device, state_dtype=self.get_state_dtype()[1])

    def _warm_up(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """Compile on this engine's layouts: the inputs of vLLM's dummy forward, pools laid out
        like its pages (see warmup.py). Makes the workspace during vLLM's profile run, so the
        memory profiler counts it before the KV cache takes the rest."""
        HK, HV = self._heads()
        K, V = self.head_k_dim, self.head_v_dim
        w = self._weights()
        state_dtype = self.get_state_dtype()[1]
        try:
            _, conv, ssm = cache_views(1, w.conv_weight.size(0), w.conv_weight.size(1), HV, V, K,
                                       mixed_qkv.dtype, state_dtype,
                                       self._cache_config.mamba_page_size_padded,
                                       is_conv_state_dim_first(), mixed_qkv.device,
                                       conv_extra=self.num_spec)
            warm_up_kernels(HK, HV, K, V, w.conv_weight, w.A_log, w.dt_bias, mixed_qkv.dtype,
                            state_dtype, self._workspace(mixed_qkv), like=(mixed_qkv, a, b),
                            pools=GDNPools(conv, ssm), max_decode_rows=self._max_reqs,
                            done=self._gdn_resources.warmed_up,
                            max_spec_len=self._gdn_resources.max_spec_len,
                            lookahead=self._gdn_resources.lookahead)
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
        step = md[self.prefix].step
        # [blocks, conv_dim, W-1], a strided view: no copy (vLLM's has k more positions with
        # speculative decoding, which the kernels leave alone: pages.py)
        conv = kernel_conv_view(self.kv_cache[0], self.conv1d.weight.size(-1),
                                is_conv_state_dim_first())
        ssm = self.kv_cache[1]
        ws = self._workspace(mixed_qkv) if step.num_prefill_tokens else None
        run_gdn_core(mixed_qkv, a, b, self._weights(), GDNPools(conv, ssm), step, core_attn_out, ws,
                     self._layer_index)


def install_layer() -> None:
    """Swap vLLM's Qwen GDN layer for ours at instantiation (idempotent), and make our builder
    count as a GDN builder where vLLM's model runner picks the builders it passes the draft counts
    to (``isinstance(builder, GDNAttentionMetadataBuilder)``; a virtual subclass: nothing of
    vLLM's builder is inherited)."""
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    if op_registry_oot.get("QwenGatedDeltaNetAttention") is not GDNGraphsQwenGDN:
        op_registry_oot.pop("QwenGatedDeltaNetAttention", None)
        QwenGatedDeltaNetAttention.register_oot(GDNGraphsQwenGDN)
    if not issubclass(GDNGraphsBuilder, GDNAttentionMetadataBuilder):
        GDNAttentionMetadataBuilder.register(GDNGraphsBuilder)


install_layer()
