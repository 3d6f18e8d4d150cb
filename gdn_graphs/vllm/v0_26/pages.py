"""vLLM 0.26's page layout of a GDN layer's Mamba state: the views the plugin hands to the kernels.

Read from vLLM 0.26: ``MambaSpec`` pages (conv window, then the recurrent state, in one page per
block, padded to ``cache_config.mamba_page_size_padded``) and ``is_conv_state_dim_first()``. With
speculative decoding (k drafts) vLLM's conv state holds W - 1 + k positions
(``MambaStateShapeCalculator.gated_delta_net_state_shape(..., num_spec)``, for its own kernels'
history); ours keep the window of every state in a slot of its own (the lookahead layout), so the
kernels get the first W - 1 positions of it and the other k are never touched.
"""

from __future__ import annotations

import torch

__all__ = ["cache_views", "kernel_conv_view"]


def kernel_conv_view(conv_state: torch.Tensor, W: int, conv_dim_first: bool) -> torch.Tensor:
    """A layer's conv state as vLLM 0.26 hands it over (``[blocks, W-1+k, C]``, or
    ``[blocks, C, W-1+k]`` when dim-first) as the kernels' ``[blocks, C, W-1]``: a strided view of
    the first W - 1 positions, no copy."""
    conv = conv_state if conv_dim_first else conv_state.transpose(-1, -2)
    if conv.shape[-1] < W - 1:
        raise ValueError(f"conv state of {conv.shape[-1]} positions, the kernels need {W - 1}")
    return conv[..., :W - 1]


def cache_views(num_blocks: int, C: int, W: int, HV: int, V: int, K: int, dtype: torch.dtype,
                state_dtype: torch.dtype, page_bytes: int | None = None,
                conv_dim_first: bool = False, device: torch.device | str = "cpu",
                conv_extra: int = 0):
    """Conv and state pools as vLLM 0.26 lays out a GDN layer's Mamba pages, in the orientation
    the plugin hands them to the kernels: conv ``[nb, C, W-1]`` and ssm ``[nb, HV, V, K]``.

    One page per block holds the conv window (vLLM's ``[W-1, C]``, or ``[C, W-1]`` when the conv
    state is dim-first) and then the state; pages are ``page_bytes`` apart (vLLM pads them to the
    attention page: ``cache_config.mamba_page_size_padded``; default, unpadded). Both views are
    ``as_strided`` over one zeroed byte buffer, returned first. ``conv_extra``: the k more
    positions vLLM's conv state has with speculative decoding (the view is of the first W - 1)."""
    csize, ssize = torch.finfo(dtype).bits // 8, torch.finfo(state_dtype).bits // 8
    Wc = W - 1 + conv_extra
    conv_bytes, ssm_bytes = Wc * C * csize, HV * V * K * ssize
    page = page_bytes or conv_bytes + ssm_bytes
    if page < conv_bytes + ssm_bytes or page % csize or page % ssize or conv_bytes % ssize:
        raise ValueError(f"page of {page} bytes cannot hold conv {conv_bytes} + state {ssm_bytes} "
                         f"bytes at their alignments")
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8, device=device)
    if conv_dim_first:
        state = torch.as_strided(raw.view(dtype), (num_blocks, C, Wc), (page // csize, Wc, 1))
    else:
        state = torch.as_strided(raw.view(dtype), (num_blocks, Wc, C), (page // csize, C, 1))
    conv = kernel_conv_view(state, W, conv_dim_first)
    ssm = torch.as_strided(raw.view(state_dtype), (num_blocks, HV, V, K),
                           (page // ssize, V * K, K, 1), conv_bytes // ssize)
    return raw, conv, ssm
