"""GDN kernels (Triton) and the plain PyTorch reference they are tested against.

    meta.py       ChunkMeta: a varlen prefill batch (spans, slots, checkpoints) on the device
    common.py     shared by the kernels: Triton helpers (softplus, l2norm, gates, masks), host
                  checks, the error-flag codes (ERR_SLOT, ERR_TOKENS, ERR_META) and error_names
    decode.py     gdn_decode, gdn_decode_multi: gating + q/k l2norm + state update, slot to slot
    workspace.py  ChunkWorkspace, ChunkConfig: the buffers and launch knobs of chunk prefill
    chunk.py      gdn_chunk_prefill: chunked prefill storing block-boundary states into the pool
    fi_prefill.py gdn_fi_prefill: the same contract on FlashInfer's SM90 kernel where it is
                  installed (fp32 pools), FiWorkspace, fi_route (which steps take it),
                  fi_capture (FlashInfer's call in CUDA graphs, replayed per step)
    fi_kernels.py its Triton prep (l2norm, gates), initial-state gather and checkpoint scatter
    conv.py       conv_decode, conv_prefill: causal depthwise conv1d (+ SiLU) over a conv pool
    conv_multi.py conv_decode_multi: a few conv tokens per row, the window after each stored
    reference.py  plain PyTorch GDN recurrence and causal conv1d in float64: the truth for tests
"""

from gdn_graphs.ops.chunk import ChunkConfig, ChunkWorkspace, gdn_chunk_prefill
from gdn_graphs.ops.common import ERR_META, ERR_SLOT, ERR_TOKENS, error_names
from gdn_graphs.ops.conv import conv_decode, conv_prefill
from gdn_graphs.ops.conv_multi import conv_decode_multi
from gdn_graphs.ops.decode import default_config, gdn_decode, gdn_decode_multi, pdl_supported
from gdn_graphs.ops.fi_prefill import FiWorkspace, fi_capture, gdn_fi_prefill
from gdn_graphs.ops.meta import (ChunkMeta, check_step_slots, chunk_meta, host_chunk_meta,
                                 make_chunk_meta)
from gdn_graphs.ops.reference import causal_conv1d_ref, gdn_gating, gdn_recurrent_ref, l2norm

__all__ = [
    "gdn_decode", "gdn_decode_multi", "default_config", "pdl_supported",
    "gdn_chunk_prefill", "ChunkWorkspace", "ChunkConfig", "gdn_fi_prefill", "FiWorkspace",
    "fi_capture",
    "conv_decode", "conv_prefill", "conv_decode_multi",
    "ChunkMeta", "chunk_meta", "host_chunk_meta", "make_chunk_meta", "check_step_slots",
    "ERR_SLOT", "ERR_TOKENS", "ERR_META", "error_names",
    "gdn_gating", "l2norm", "gdn_recurrent_ref", "causal_conv1d_ref",
]
