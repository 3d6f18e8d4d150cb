"""Compile the GDN kernels before the first request (vLLM's profile run calls this).

Triton compiles a kernel on its first launch, and again for every new *specialisation*: integer
arguments that are 1 or multiples of 16, pointers aligned to 16 bytes, and the constexprs a
launch derives from its shapes (the decode tile depends on the number of rows). Unwarmed, the first
prefill of a fresh engine paid ~6 s of compilation on an H200 (profiling/results/2026-11-29). A
warm-up that launches with other strides than the engine's compiles kernels the engine never uses.

So the warm-up launches on the engine's layouts: the layer's own input tensors from vLLM's dummy
forward (``like``: mixed_qkv, a, b, whose strides and offsets depend on how the model packs its
projections) and pools laid out like the engine's state pages (the caller builds them: for vLLM
0.26, ``gdn_graphs.vllm.v0_26.pages.cache_views``). Its steps, all of whose slots are NO_SLOT (no pool is read or written): two mixed steps
(1 and 2 decode rows, then a prefill row crossing a chunk boundary mid-chunk, then padding), the
same two with several prefill rows (one step for each other launch config of the chunk kernels,
``gdn_graphs.ops.workspace.chunk_config``, with the fewest rows that pick it), the
same two with the prefill row from position 0 when the workspace carries a FiWorkspace (the
FlashInfer prefill path: its kernels and FlashInfer's compile), and a pure decode for each decode
tile the kernel picks by row count; with speculative decoding also spec rows of 1 + k tokens for
each of those row counts, spec rows of mixed lengths and spec rows before a prefill row.
``tests/test_vllm_warmup.py``
checks that an engine's launches need no compile the warm-up did not do.
"""

from __future__ import annotations

import numpy as np
import torch

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.decode import default_config
from gdn_graphs.ops.workspace import FEW_PAIRS_MAX, GLUON_MIN_PAIRS, chunk_config
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.vllm.slots import DeviceTablePlanner

__all__ = ["warm_up_kernels"]


def _zeros_like_layout(t: torch.Tensor, rows: int) -> torch.Tensor:
    """Zeros with ``t``'s strides and storage offset (so the same 16-byte alignment), ``rows``
    rows instead of ``t.shape[0]``."""
    shape = (rows, *t.shape[1:])
    span = 1 + sum((n - 1) * s for n, s in zip(shape, t.stride()))
    base = torch.zeros(t.storage_offset() + span, dtype=t.dtype, device=t.device)
    return torch.as_strided(base, shape, t.stride(), t.storage_offset())


def _decode_row_counts(K: int, V: int, state_dtype: torch.dtype, max_rows: int) -> list[int]:
    """The smallest row count of each decode tile ``gdn_decode`` picks for 1..max_rows rows."""
    first: dict = {}
    n = 1
    while n <= max_rows:
        first.setdefault(default_config(K, V, n, state_dtype), n)
        n *= 2
    return sorted(first.values())


def warm_up_kernels(HK: int, HV: int, K: int, V: int, conv_weight: torch.Tensor, A_log, dt_bias,
                    dtype: torch.dtype, state_dtype: torch.dtype, workspace=None, *,
                    like: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                    pools: GDNPools | None = None, max_decode_rows: int = 1024,
                    done: set | None = None, max_spec_len: int = 0, lookahead: int = 0) -> bool:
    """Launch every kernel variant an engine step can need. Returns False, launching nothing, if
    ``done`` (the caller's record of warm-ups, one per engine) already holds this (shapes, dtypes,
    layouts, device); records it there otherwise.

    conv_weight [C, W] is the layer's. like: the layer's (mixed_qkv, a, b) as the engine passes
    them (default: contiguous). pools: conv [>= 1, C, W-1] and ssm [>= 1, HV, V, K] laid out like
    the engine's (default: contiguous); no slot of them is read or written. Nothing is mutated but
    scratch buffers made here. max_spec_len, lookahead: the engine planner's (1 + k and R with
    speculative decoding: the spec kernels' slot buffers then have its shape).
    """
    device = conv_weight.device
    C, W = conv_weight.shape
    if C != 2 * HK * K + HV * V:
        raise ValueError(f"conv weight has {C} channels, q|k|v have {2 * HK * K + HV * V}")
    if pools is None:
        pools = GDNPools(torch.zeros(1, C, W - 1, dtype=dtype, device=device),
                         torch.zeros(1, HV, V, K, dtype=state_dtype, device=device))
    layouts = tuple((t.stride(), t.storage_offset() % 16) for t in (*(like or ()), *pools))
    key = (HK, HV, K, V, C, W, dtype, state_dtype, str(device), layouts, max_spec_len)
    if done is not None and key in done:
        return False
    n_pre = 2 * CHUNK + 1                         # starts mid-chunk: partial, full, partial chunks
    decode_rows = _decode_row_counts(K, V, state_dtype, max_decode_rows)
    # the fewest prefill rows that pick each launch config (chunk_config's thresholds are counts
    # of (row, value head) pairs, so one row more than the larger threshold reaches every one);
    # one row is the mixed steps'
    gluon_ok = gluon_seq_supported(torch.empty(1, HV, V, dtype=dtype, device=device), K)
    first_rows: dict = {}
    for n in range(1, max(GLUON_MIN_PAIRS, FEW_PAIRS_MAX) + 2):
        first_rows.setdefault(chunk_config(n, dtype, HV, gluon_ok), n)
    several = sorted(n for n in first_rows.values() if n > 1)
    many = max(several, default=1)
    short = 2                                     # the other prefill rows of those steps
    T = max(2 + n_pre + (many - 1) * short + 2, 3 * max_spec_len + n_pre,
            max(decode_rows) * max(max_spec_len, 1))
    if like is None:
        like = (torch.zeros(T, C, dtype=dtype, device=device),
                torch.zeros(T, HV, dtype=dtype, device=device),
                torch.zeros(T, HV, dtype=dtype, device=device))
    x, a, b = (_zeros_like_layout(t, T) for t in like)
    out = torch.empty(T, HV, V, dtype=dtype, device=device)
    rows = max(4, 2 + many, max(decode_rows))
    width = 8 + lookahead
    planner = DeviceTablePlanner(rows, T, CHUNK, None, width, null_block=0, device=device,
                                 max_spec_len=max_spec_len, lookahead=lookahead)
    table = torch.zeros(rows, width, dtype=torch.int32, device=device)  # all null: NO_SLOT
    weights = GDNWeights(conv_weight, None, A_log, dt_bias)

    def step(qsl, n, spec_rows=0):
        # spec rows also through the placement from device counts (async scheduling)
        seq_lens = (torch.tensor(np.asarray(n) + np.diff(qsl), dtype=torch.int32, device=device)
                    if spec_rows else None)
        gdn_step = planner.plan(np.asarray(qsl), np.asarray(n), table, spec_rows=spec_rows,
                                pad_decodes_to=len(n) if spec_rows else None,
                                device_seq_lens=seq_lens)
        run_gdn_core(x, a, b, weights, pools, gdn_step, out, workspace)

    # mixed steps: 1 and 2 decode rows move the prefill's inputs by one and two rows (their
    # 16-byte alignment can differ), a prefill row from position 37, padding after it
    for nd in (1, 2):
        step([*range(nd + 1), nd + n_pre], [5] * nd + [37])
    # several prefill rows: the other launch knobs (gdn_graphs.ops.workspace.chunk_config), after
    # the same two decode offsets
    # (a row like the mixed steps' and short ones: the knobs depend on the count, not the lengths)
    for rows_n in several:
        for nd in (1, 2):
            step([*range(nd + 1), *(nd + n_pre + i * short for i in range(rows_n))],
                 [5] * nd + [37] * rows_n)
    if getattr(workspace, "fi", None) is not None:
        # the FlashInfer path (a prefill row from position 0: fi_route takes it): its three
        # Triton kernels at both input offsets, and FlashInfer's own compile (8-17 s, once: its
        # one configuration serves every step), so that none happens after start-up
        for nd in (1, 2):
            step([*range(nd + 1), nd + n_pre], [5] * nd + [0])
    for n_rows in decode_rows:                    # pure decode, one per decode tile
        step(list(range(n_rows + 1)), [5] * n_rows)
    L = max_spec_len
    if L:
        for n_rows in decode_rows:                # spec rows of 1 + k tokens, one per tile
            step(list(range(0, L * n_rows + 1, L)), [5] * n_rows, spec_rows=n_rows)
        lens = [1, L, max(L - 1, 1)]              # spec rows of mixed lengths, then a prefill
        step(np.cumsum([0, *lens]).tolist(), [5] * 3, spec_rows=3)
        step(np.cumsum([0, *lens, n_pre]).tolist(), [5] * 3 + [37], spec_rows=3)
    if int((planner.slots.flat >= 0).sum()) != 0:
        raise AssertionError("warm-up step addressed a pool slot")  # cannot happen: all null
    if done is not None:
        done.add(key)
    return True
