"""vLLM 0.26's page layout of a GDN layer's Mamba state: the views the plugin hands to the kernels.

Read from vLLM 0.26: ``MambaSpec`` pages (conv window, then the recurrent state, in one page per
block, padded to ``cache_config.mamba_page_size_padded``) and ``is_conv_state_dim_first()``.
"""

from __future__ import annotations

import torch

__all__ = ["cache_views"]


def cache_views(num_blocks: int, C: int, W: int, HV: int, V: int, K: int, dtype: torch.dtype,
                state_dtype: torch.dtype, page_bytes: int | None = None,
                conv_dim_first: bool = False, device: torch.device | str = "cpu"):
    """Conv and state pools as vLLM 0.26 lays out a GDN layer's Mamba pages, in the orientation
    the plugin hands them to the kernels: conv ``[nb, C, W-1]`` and ssm ``[nb, HV, V, K]``.

    One page per block holds the conv window (vLLM's ``[W-1, C]``, or ``[C, W-1]`` when the conv
    state is dim-first) and then the state; pages are ``page_bytes`` apart (vLLM pads them to the
    attention page: ``cache_config.mamba_page_size_padded``; default, unpadded). Both views are
    ``as_strided`` over one zeroed byte buffer, returned first."""
    csize, ssize = torch.finfo(dtype).bits // 8, torch.finfo(state_dtype).bits // 8
    conv_bytes, ssm_bytes = (W - 1) * C * csize, HV * V * K * ssize
    page = page_bytes or conv_bytes + ssm_bytes
    if page < conv_bytes + ssm_bytes or page % csize or page % ssize or conv_bytes % ssize:
        raise ValueError(f"page of {page} bytes cannot hold conv {conv_bytes} + state {ssm_bytes} "
                         f"bytes at their alignments")
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8, device=device)
    if conv_dim_first:
        conv = torch.as_strided(raw.view(dtype), (num_blocks, C, W - 1), (page // csize, W - 1, 1))
    else:
        conv = torch.as_strided(raw.view(dtype), (num_blocks, W - 1, C),
                                (page // csize, C, 1)).transpose(-1, -2)
    ssm = torch.as_strided(raw.view(state_dtype), (num_blocks, HV, V, K),
                           (page // ssize, V * K, K, 1), conv_bytes // ssize)
    return raw, conv, ssm
