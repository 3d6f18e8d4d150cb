"""The GDN core of a layer (conv + recurrence over the state pools): ``run_gdn_core``, the one entry
every engine calls, and ``gdn_graphs::gdn_core``, the same as an opaque torch op.

``run_gdn_core(mixed_qkv, a, b, weights, pools, step, out, workspace)`` runs one layer over a
step's flat batch ``[decode rows | spec rows | prefill tokens | padding]`` (``GDNStep``,
gdn_graphs.runtime.step): decode rows go through conv_decode + gdn_decode with
``step.decode_read/decode_write``, spec rows (1 + k tokens each) through conv_decode_multi +
gdn_decode_multi with ``step.spec_read/spec_write/spec_cu`` (a state and window stored after every
token), prefill tokens through conv_prefill + gdn_chunk_prefill with ``step.prefill`` (or
gdn_fi_prefill, FlashInfer's kernel inside the same contract, where the workspace carries a
FiWorkspace and ``fi_route`` accepts the step); padding gets zero outputs.
It launches kernels only (no sync, no host reads of tensor values), so it may run inside a CUDA
graph capture: the embedded engine's FULL decode graphs, vLLM's, the warm-up, the tests.

Why an opaque op too: torch.compile must not trace the kernels' host logic (slices that depend on
how many rows of the batch are decodes, launch grids, pool pointers), and Inductor's graph
partition splits the compiled graph around ops tagged ``cudagraph_unsafe``, so everything else
(projections, norms, MLPs) is captured piecewise into CUDA graphs while this op runs eagerly
between them with the layout of the current step. That layout is NOT an argument (host integers
would become compile-time constants, a recompile every step): the engine publishes the step in a
``StepContext`` before each forward, like vLLM's forward context:

    with step_context(StepContext(step=planner.plan(...), workspace=ws)):
        hidden = model(input_ids)

Inside a FULL decode graph the context read at capture time (a template step with the graph's
padded decode count) stays valid for every replay: the slots live in persistent buffers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from gdn_graphs import nvtx
from gdn_graphs.ops.chunk import ChunkWorkspace, gdn_chunk_prefill
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.conv import conv_decode, conv_prefill, prefill_tail_ok
from gdn_graphs.ops.conv_multi import conv_decode_multi
from gdn_graphs.ops.decode import gdn_decode, gdn_decode_multi, pdl_supported
from gdn_graphs.ops.fi_prefill import fi_route, gdn_fi_prefill
from gdn_graphs.ops.workspace import chunk_config
from gdn_graphs.runtime.step import GDNStep

__all__ = ["GDNWeights", "GDNPools", "StepContext", "step_context", "get_step_context",
           "gdn_core", "run_gdn_core"]


class GDNWeights(NamedTuple):
    """A layer's weights that the core reads."""

    conv_weight: torch.Tensor             # [conv_dim, W] (SiLU activation)
    conv_bias: Optional[torch.Tensor]     # [conv_dim] or None
    A_log: torch.Tensor                   # [HV] float32
    dt_bias: torch.Tensor                 # [HV] float32


class GDNPools(NamedTuple):
    """A layer's state pools, written in place at the step's write and checkpoint slots."""

    conv: torch.Tensor                    # [num_slots, conv_dim, W-1] (any slot stride)
    ssm: torch.Tensor                     # [num_slots, HV, V, K] fp32 or bf16 (any slot stride)


@dataclass
class StepContext:
    """What the ``gdn_core`` op of every layer reads about the current step."""

    step: GDNStep
    workspace: Optional[ChunkWorkspace] = None   # scratch for the chunk kernels (prefill steps)
    # Debug: when a dict, every layer appends a copy of its core output (real tokens only) under
    # its layer index. Never set it while capturing a CUDA graph.
    record: Optional[dict] = None


_CTX: Optional[StepContext] = None


def get_step_context() -> StepContext:
    if _CTX is None:
        raise RuntimeError("gdn_core called outside a step_context(...): the engine must publish "
                           "the step before running the model")
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


def run_gdn_core(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, weights: GDNWeights,
                 pools: GDNPools, step: GDNStep, out: torch.Tensor,
                 workspace: Optional[ChunkWorkspace] = None, layer: int = -1) -> torch.Tensor:
    """Conv + GDN recurrence of one layer over ``step``'s flat batch.

    mixed_qkv [T, conv_dim] (packed q|k|v before the conv, conv_dim = 2*HK*K + HV*V), a, b [T, HV]:
    the layer's inputs for T >= step.num_tokens rows. Writes ``out`` [T, HV, V] (rows past the
    step's tokens zeroed) and the pools' write/checkpoint slots; returns ``out``. Every kernel
    gets ``step.error_flag`` (when not None) and ORs into it what it met that no slot or token
    check on the host could have caught (gdn_graphs.ops.common). ``layer`` is only the payload
    of the NVTX ranges gdn.core, gdn.core.decode and gdn.core.prefill (gdn_graphs.nvtx).
    """
    with nvtx.range("gdn.core", layer):
        return _run(mixed_qkv, a, b, weights, pools, step, out, workspace, layer)


def _run(mixed_qkv, a, b, weights, pools, step, out, workspace, layer):
    T = mixed_qkv.shape[0]
    _, HV, V, K = pools.ssm.shape
    HK = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    nd, n_spec, n_pre = step.num_decodes, step.num_spec_tokens, step.num_prefill_tokens
    if nd + n_spec + n_pre > T:
        raise ValueError(f"gdn_core: step has {nd} decode + {n_spec} spec + {n_pre} prefill "
                         f"tokens, batch holds {T}")
    w = weights
    flag = step.error_flag
    conv_out = torch.empty_like(mixed_qkv)
    if nd:
        with nvtx.range("gdn.core.decode", layer):
            r_slot, w_slot = step.decode_read[:nd], step.decode_write[:nd]
            conv_decode(mixed_qkv[:nd], w.conv_weight, w.conv_bias, pools.conv, r_slot, w_slot,
                        out=conv_out[:nd], error_flag=flag)
            q, k, v = _split_qkv(conv_out[:nd], HK, K, HV, V)
            # programmatic dependent launch: the state loads overlap conv_decode, which writes
            # only the conv pool, conv_out and the error flag (the state pool's write slots are
            # read by no row; gdn_decode touches the flag only after its wait)
            gdn_decode(q, k, v, a[:nd], b[:nd], w.A_log, w.dt_bias, pools.ssm, r_slot, w_slot,
                       out=out[:nd], pdl=pdl_supported(q.device), error_flag=flag)
    if n_spec:
        with nvtx.range("gdn.core.spec", layer):
            _run_spec(mixed_qkv, a, b, w, pools, step, out, conv_out, (HK, K, HV, V))
    nd += n_spec  # the prefill tokens start after the spec rows
    if n_pre:
        with nvtx.range("gdn.core.prefill", layer):
            sl = slice(nd, nd + n_pre)
            # FlashInfer's kernel where the engine gave it a workspace and the step allows it
            # (gdn_graphs.ops.fi_prefill: same contract, fp32 pools, 64-aligned starts); in one
            # group, the conv writes v straight into its workspace (no copy of v in the prep)
            fi = fi_route(workspace, step, n_pre, pools.ssm, out[sl])
            v_ws = (fi is not None and fi[1] <= workspace.fi.max_seqs
                    and prefill_tail_ok(mixed_qkv.shape[1], 2 * HK * K))
            tail = dict(tail_out=workspace.fi.v[:n_pre].view(n_pre, HV * V),
                        tail_from=2 * HK * K) if v_ws else {}
            conv_prefill(mixed_qkv[sl], w.conv_weight, w.conv_bias, pools.conv, step.prefill,
                         out=conv_out[sl], error_flag=flag, **tail)
            q, k, v = _split_qkv(conv_out[sl], HK, K, HV, V)
            if fi is not None:
                gdn_fi_prefill(q, k, v, a[sl], b[sl], w.A_log, w.dt_bias, pools.ssm, step.prefill,
                               out[sl], workspace.fi, error_flag=flag, num_seqs=fi[1], every=fi[0],
                               v_in_workspace=v_ws)
            else:
                # launch knobs by the host count of prefill rows (a template without its host
                # plan: the default); every config computes the same bits
                host = getattr(step, "host", None)
                cfg = chunk_config(None if host is None else host.num_prefills, q.dtype, HV,
                                   gluon_seq_supported(v, K))
                gdn_chunk_prefill(q, k, v, a[sl], b[sl], w.A_log, w.dt_bias, pools.ssm,
                                  step.prefill, out=out[sl], workspace=workspace, config=cfg,
                                  error_flag=flag)
    if nd + n_pre < T:
        out[nd + n_pre:].zero_()
    return out


def _run_spec(mixed_qkv, a, b, w, pools, step, out, conv_out, dims):
    """The spec rows of ``step``: tokens [num_decodes, num_decodes + num_spec_tokens) of the flat
    batch. Mutates conv_out and out on those tokens and the pools' spec write slots."""
    HK, K, HV, V = dims
    nd, ns = step.num_decodes, step.num_spec
    sl = slice(nd, nd + step.num_spec_tokens)
    cu, r_slot, w_slots = step.spec_cu[:ns + 1], step.spec_read[:ns], step.spec_write[:ns]
    flag = step.error_flag
    conv_decode_multi(mixed_qkv[sl], w.conv_weight, w.conv_bias, pools.conv, cu, r_slot, w_slots,
                      out=conv_out[sl], error_flag=flag)
    q, k, v = _split_qkv(conv_out[sl], HK, K, HV, V)
    # (programmatic dependent launch as for the decode rows: conv_decode_multi writes only the
    # conv pool, conv_out and the flag)
    gdn_decode_multi(q, k, v, a[sl], b[sl], w.A_log, w.dt_bias, pools.ssm, cu, r_slot, w_slots,
                     out=out[sl], pdl=pdl_supported(q.device), error_flag=flag)


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
        layer_idx:   index of the layer (the debug record and the NVTX payload).
    Returns o [T, HV, V] in mixed_qkv's dtype; rows past the step's real tokens are zero.
    """
    ctx = get_step_context()
    _, HV, V, _ = ssm_pool.shape
    o = mixed_qkv.new_empty(mixed_qkv.shape[0], HV, V)
    run_gdn_core(mixed_qkv, a, b, GDNWeights(conv_weight, conv_bias, A_log, dt_bias),
                 GDNPools(conv_pool, ssm_pool), ctx.step, o, ctx.workspace, layer_idx)
    if ctx.record is not None:
        ctx.record.setdefault(layer_idx, []).append(o[:ctx.step.num_tokens].detach().clone())
    return o


@gdn_core.register_fake
def _gdn_core_fake(mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_pool, ssm_pool,
                   layer_idx):
    _, HV, V, _ = ssm_pool.shape
    return mixed_qkv.new_empty(mixed_qkv.shape[0], HV, V)
