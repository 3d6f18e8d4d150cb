"""The vLLM warm-up with speculative decoding compiles every kernel variant that steps of spec
rows launch (the lookahead layout: rows of 1 + k tokens, mixed lengths, spec rows before a
prefill), so no gdn_graphs kernel compiles after start-up there either (no vLLM needed)."""

import numpy as np
import pytest
import torch

from gdn_graphs.ops import chunk, conv, conv_multi, decode
from gdn_graphs.ops.chunk import ChunkWorkspace
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.vllm.slots import DeviceTablePlanner
from gdn_graphs.vllm.v0_26.pages import cache_views
from gdn_graphs.vllm.warmup import warm_up_kernels
from test_vllm_warmup import C, HK, HV, K, V, W, Recorder, engine_inputs

SPEC_KERNELS = [(chunk, "_chunk_intra_kernel"), (chunk, "_chunk_seq_kernel"),
                (conv, "_conv_prefill_kernel"), (conv_multi, "_conv_decode_multi_kernel"),
                (decode, "_gdn_decode_kernel")]


@pytest.fixture
def spec_launches(monkeypatch):
    log = []
    for mod, name in SPEC_KERNELS:
        monkeypatch.setattr(mod, name, Recorder(name, getattr(mod, name), log))
    yield log


def engine_steps(k):
    L = 1 + k
    return [  # (scheduled tokens per request, tokens computed before); spec rows first
        ([300], [0]),                                   # cold prefill: no spec rows
        ([L, 1, 2, 70], [300, 127, 37, 5]),             # spec rows of mixed lengths + prefill
        ([L] * 3, [302, 129, 108]),                     # uniform spec rows, small and large
        ([L] * 16, list(range(100, 116))),
        ([L] * 20, list(range(200, 220))),
        ([1, L, L - 1], [250, 251, 252]),
    ]


@pytest.mark.parametrize("k", [2, 3])
def test_spec_steps_need_no_compile_the_warm_up_did_not_do(spec_launches, k):
    dtype, state_dtype, B = torch.bfloat16, torch.float32, 128
    R = k + 1  # spec_lookahead(k)
    torch.manual_seed(0)
    page = (W - 1 + k) * C * 2 + HV * V * K * 4 + 4096  # vLLM's conv state: W - 1 + k positions
    w = torch.randn(C, W).to(dtype) * 0.5
    A_log, dt_bias = torch.rand(HV), torch.randn(HV).to(dtype)
    max_reqs, max_tokens = 24, 500
    ws = ChunkWorkspace(max_tokens, HV, K, V, dtype, "cpu", HK=HK)
    width = 12 + R
    table = torch.arange(1, 1 + max_reqs * width, dtype=torch.int32).view(max_reqs, width)
    _, conv_p, ssm_p = cache_views(int(table.max()) + 1, C, W, HV, V, K, dtype, state_dtype,
                                   page_bytes=page, conv_extra=k)
    weights, pools = GDNWeights(w, None, A_log, dt_bias), GDNPools(conv_p, ssm_p)
    planner = DeviceTablePlanner(max_reqs, max_tokens, B, table.stride(0), width,
                                 max_spec_len=1 + k, lookahead=R)
    steps = engine_steps(k)
    T_max = max(sum(q) for q, _ in steps) + 8
    x_all, a_all, b_all = engine_inputs(T_max, "qwen3_next", dtype)
    for q, n in steps:
        T = sum(q) + 8
        spec_rows = next((i for i, x in enumerate(q) if x > 1 + k), len(q))
        qsl = np.concatenate([[0], np.cumsum(q)])
        step = planner.plan(qsl, np.array(n), table[:len(q)], pad_decodes_to=len(q),
                            spec_rows=spec_rows)
        run_gdn_core(x_all[:T], a_all[:T], b_all[:T], weights, pools, step,
                     torch.zeros(T, HV, V, dtype=dtype), ws)
    engine = set(spec_launches)
    spec_launches.clear()
    one_page = GDNPools(*cache_views(1, C, W, HV, V, K, dtype, state_dtype, page_bytes=page,
                                     conv_extra=k)[1:])
    assert warm_up_kernels(HK, HV, K, V, w, A_log, dt_bias, dtype, state_dtype, ws,
                           like=(x_all, a_all, b_all), pools=one_page, max_decode_rows=max_reqs,
                           max_spec_len=1 + k, lookahead=R)
    missing = engine - set(spec_launches)
    assert not missing, "kernels the engine would compile during inference:\n" + "\n".join(
        f"{name}: {dict(key)}" for name, key in sorted(missing, key=str))
    assert "_conv_decode_multi_kernel" in {name for name, _ in engine}
