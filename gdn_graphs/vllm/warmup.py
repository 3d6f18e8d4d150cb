"""Compile the GDN kernels before the first request (vLLM's profile run calls this).

Triton compiles a kernel on its first launch; unwarmed, the first prefill of a fresh engine paid
~6 s of compilation on an H200 (profiling/results/2026-11-29/vllm_speed_nopc). The warm-up runs one
mixed step (a decode row, a prefill row that crosses a chunk boundary mid-chunk, padding) whose
slots are all NO_SLOT, so no pool is read or written: the pools here are 1-slot stand-ins laid out
like the engine's (same dtypes and strides per slot), only there so the launches type-check.
"""

from __future__ import annotations

import numpy as np
import torch

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.custom_ops import run_gdn_core
from gdn_graphs.vllm.slots import DeviceTablePlanner

__all__ = ["warm_up_kernels"]

_DONE: set = set()


def warm_up_kernels(HK: int, HV: int, K: int, V: int, conv_weight: torch.Tensor, A_log, dt_bias,
                    dtype: torch.dtype, state_dtype: torch.dtype, workspace=None) -> bool:
    """Launch decode + prefill once per (shapes, dtypes, device). Returns False if already done.

    conv_weight [C, W] is the layer's; nothing is mutated but the outputs of the dummy step."""
    device = conv_weight.device
    C, W = conv_weight.shape
    if C != 2 * HK * K + HV * V:
        raise ValueError(f"conv weight has {C} channels, q|k|v have {2 * HK * K + HV * V}")
    key = (HK, HV, K, V, C, W, dtype, state_dtype, str(device))
    if key in _DONE:
        return False
    n_pre = 2 * CHUNK + 1                      # starts mid-chunk: partial, full and partial chunks
    T = 1 + n_pre + 2                          # decode row, prefill row, padding
    planner = DeviceTablePlanner(2, T, CHUNK, 8, 8, null_block=0, device=device)
    table = torch.zeros(2, 8, dtype=torch.int32, device=device)   # every block null -> NO_SLOT
    layout = planner.plan(np.array([0, 1, 1 + n_pre]), np.array([5, 37]), table)
    conv = torch.zeros(1, W - 1, C, dtype=dtype, device=device).transpose(-1, -2)
    ssm = torch.zeros(1, HV, V, K, dtype=state_dtype, device=device)
    x = torch.zeros(T, C, dtype=dtype, device=device)
    ab = torch.zeros(T, HV, dtype=dtype, device=device)
    out = torch.empty(T, HV, V, dtype=dtype, device=device)
    run_gdn_core(x, ab, ab, conv_weight, None, A_log, dt_bias, conv, ssm, out, layout.num_decodes,
                 layout.num_prefill_tokens, planner.decode_read, planner.decode_write,
                 planner.prefill, workspace)
    if int((planner.slots.flat >= 0).sum()) != 0:
        raise AssertionError("warm-up step addressed a pool slot")  # cannot happen: all null
    _DONE.add(key)
    return True
