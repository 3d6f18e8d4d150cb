"""``gdn_graphs::gdn_core``: a GDN layer's conv + recurrence as ONE opaque torch op.

Why one opaque op: torch.compile must not trace the kernels' host logic (slices that depend on how
many rows of the batch are decodes, launch grids, pool pointers), and Inductor's graph partition
splits the compiled graph around ops tagged ``cudagraph_unsafe``, so everything else (projections,
norms, MLPs) is captured piecewise into CUDA graphs while this op runs eagerly between them with
the batch layout of the current step.

The batch layout is NOT an argument: host integers such as the number of decode rows would become
compile-time constants (a recompile every step). The engine publishes them, with the planner's
persistent device buffers, in a ``StepContext`` before each forward (like vLLM's forward context):

    with step_context(StepContext(num_decodes=..., num_prefill_tokens=..., decode_read=...,
                                  decode_write=..., prefill=planner.prefill, workspace=ws)):
        hidden = model(input_ids)

The flat token batch is [decode rows | prefill tokens | padding]. Decode rows (one token each) go
through conv_decode + gdn_decode with slots ``decode_read/decode_write[:num_decodes]``; the prefill
tokens through conv_prefill + gdn_chunk_prefill with ``prefill`` (a ChunkMeta); padding tokens get
zero outputs. Under FULL CUDA-graph decode the op runs inside the captured region: it launches
kernels only (no sync, no host reads of tensor values), and the context it reads at capture time
(the padded decode count of that graph) stays valid for every replay.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = ["StepContext", "step_context", "get_step_context", "gdn_core", "run_gdn_core"]


@dataclass
class StepContext:
    """What the GDN core of every layer needs to know about the current step."""

    num_decodes: int                      # leading decode rows (padded count in a decode graph)
    num_prefill_tokens: int               # prefill tokens after them
    decode_read: Optional[torch.Tensor] = None   # int32 [>= num_decodes]
    decode_write: Optional[torch.Tensor] = None  # int32 [>= num_decodes]
    prefill: Any = None                   # ChunkMeta of persistent tensors (None: no prefill rows)
    workspace: Any = None                 # ChunkWorkspace (optional scratch for the chunk kernels)
    # Debug: when a dict, every layer appends a copy of its core output (real tokens only) under
    # its layer index. Never set it while capturing a CUDA graph.
    record: Optional[dict] = field(default=None)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.num_prefill_tokens


_CTX: Optional[StepContext] = None


def get_step_context() -> StepContext:
    if _CTX is None:
        raise RuntimeError("gdn_core called outside a step_context(...): the engine must publish "
                           "the batch layout before running the model")
    return _CTX


@contextlib.contextmanager
def step_context(ctx: StepContext):
    """Publish ``ctx`` for the duration of a forward (restores the previous one after)."""
    global _CTX
    prev, _CTX = _CTX, ctx
    try:
        yield ctx
    finally:
        _CTX = prev


def _split_qkv(x: torch.Tensor, HK: int, K: int, HV: int, V: int):
    """Views q [T,HK,K], k [T,HK,K], v [T,HV,V] into the packed conv output x [T, conv_dim]."""
    q = x[:, : HK * K].unflatten(1, (HK, K))
    k = x[:, HK * K: 2 * HK * K].unflatten(1, (HK, K))
    v = x[:, 2 * HK * K:].unflatten(1, (HV, V))
    return q, k, v


def run_gdn_core(mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_pool, ssm_pool, out,
                 num_decodes, num_prefill_tokens, decode_read, decode_write, prefill, workspace=None):
    """The body of ``gdn_core`` with the batch layout passed in: what an engine that owns its own
    custom op (vLLM's ``qwen_gdn_attention_core``) calls from inside it.

    Flat batch = [num_decodes rows of one token | num_prefill_tokens prefill tokens | padding].
    Writes ``out`` [T, HV, V] (padding rows zeroed) and the pools' write/checkpoint slots; launches
    kernels only (no sync), so it may run inside a CUDA-graph capture.
    """
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    from gdn_graphs.ops.conv import conv_decode, conv_prefill
    from gdn_graphs.ops.decode import gdn_decode, pdl_supported

    T = mixed_qkv.shape[0]
    _, HV, V, K = ssm_pool.shape
    HK = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    nd, tp = num_decodes, num_prefill_tokens
    if nd + tp > T:
        raise ValueError(f"gdn_core: step has {nd} decode + {tp} prefill tokens, batch holds {T}")
    conv_out = torch.empty_like(mixed_qkv)
    if nd:
        rs, ws = decode_read[:nd], decode_write[:nd]
        conv_decode(mixed_qkv[:nd], conv_weight, conv_bias, conv_pool, rs, ws, out=conv_out[:nd])
        q, k, v = _split_qkv(conv_out[:nd], HK, K, HV, V)
        # programmatic dependent launch: the state loads overlap conv_decode, which writes only
        # the conv pool and conv_out (the state pool's write slots are read by no row)
        gdn_decode(q, k, v, a[:nd], b[:nd], A_log, dt_bias, ssm_pool, rs, ws, out=out[:nd],
                   pdl=pdl_supported(q.device))
    if tp:
        sl = slice(nd, nd + tp)
        conv_prefill(mixed_qkv[sl], conv_weight, conv_bias, conv_pool, prefill, out=conv_out[sl])
        q, k, v = _split_qkv(conv_out[sl], HK, K, HV, V)
        gdn_chunk_prefill(q, k, v, a[sl], b[sl], A_log, dt_bias, ssm_pool, prefill,
                          out=out[sl], workspace=workspace)
    if nd + tp < T:
        out[nd + tp:].zero_()
    return out


@torch.library.custom_op(
    "gdn_graphs::gdn_core",
    mutates_args=("conv_pool", "ssm_pool"),
    tags=(torch._C.Tag.cudagraph_unsafe,),
)
def gdn_core(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: Optional[torch.Tensor],
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_pool: torch.Tensor,
    ssm_pool: torch.Tensor,
    layer_idx: int,
) -> torch.Tensor:
    """Conv + GDN recurrence of one layer over the step's flat batch.

    Args:
        mixed_qkv:   [T, conv_dim] packed q|k|v before the conv, conv_dim = 2*HK*K + HV*V.
        a, b:        [T, HV] gate inputs.
        conv_weight: [conv_dim, W]; conv_bias [conv_dim] or None. SiLU activation.
        A_log, dt_bias: [HV] float32.
        conv_pool:   [num_slots, conv_dim, W-1]  MUTATED (the step's write/checkpoint slots).
        ssm_pool:    [num_slots, HV, V, K] fp32  MUTATED (the step's write/checkpoint slots).
        layer_idx:   index of the layer (only used for the debug record).
    Returns o [T, HV, V] in mixed_qkv's dtype; rows past the step's real tokens are zero.
    """
    ctx = get_step_context()
    _, HV, V, _ = ssm_pool.shape
    o = mixed_qkv.new_empty(mixed_qkv.shape[0], HV, V)
    run_gdn_core(mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_pool, ssm_pool, o,
                 ctx.num_decodes, ctx.num_prefill_tokens, ctx.decode_read, ctx.decode_write,
                 ctx.prefill, ctx.workspace)
    nd, tp = ctx.num_decodes, ctx.num_prefill_tokens
    if ctx.record is not None:
        ctx.record.setdefault(layer_idx, []).append(o[: nd + tp].detach().clone())
    return o


@gdn_core.register_fake
def _gdn_core_fake(mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_pool, ssm_pool,
                   layer_idx):
    _, HV, V, _ = ssm_pool.shape
    return mixed_qkv.new_empty(mixed_qkv.shape[0], HV, V)
