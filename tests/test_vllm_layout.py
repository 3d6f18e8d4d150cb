"""The GDN core on vLLM's cache layout, no vLLM needed.

vLLM 0.26 keeps one page per block holding a layer's conv window then its GDN state, and hands the
layer two strided views of it (``torch.as_strided`` over one raw buffer): conv ``[blocks, W-1, C]``
(transposed by the layer to ``[blocks, C, W-1]``) and ssm ``[blocks, HV, V, K]``, both with the page
as block stride. The plugin runs our kernels on those views without copies; this checks that a
mixed step (decodes across and inside a block, a warm prefill with checkpoints) gives the same
outputs and states as on contiguous pools, and that no other page changes.
"""

import numpy as np
import pytest
import torch

from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.vllm.slots import DeviceTablePlanner
from gdn_graphs.vllm.v0_26.pages import cache_views

HK, HV, K, V, W = 1, 2, 16, 16, 4
C = 2 * HK * K + HV * V


def vllm_pages(num_blocks, dtype, state_dtype, pad_bytes=96, conv_extra=0):
    """Pages padded past the content (vLLM pads them to the attention page); ``conv_extra``: the
    k more conv positions vLLM's pages have with speculative decoding."""
    bits = torch.finfo(dtype).bits // 8, torch.finfo(state_dtype).bits // 8
    page = (W - 1 + conv_extra) * C * bits[0] + HV * V * K * bits[1] + pad_bytes
    return cache_views(num_blocks, C, W, HV, V, K, dtype, state_dtype, page_bytes=page,
                       conv_extra=conv_extra)


@pytest.mark.parametrize("dtype,state_dtype,conv_extra", [
    (torch.float32, torch.float32, 0), (torch.bfloat16, torch.bfloat16, 0),
    (torch.bfloat16, torch.float32, 3)])
def test_core_on_vllm_pages_equals_contiguous(dtype, state_dtype, conv_extra):
    torch.manual_seed(0)
    B, nb = 64, 24
    raw, conv_v, ssm_v = vllm_pages(nb, dtype, state_dtype, conv_extra=conv_extra)
    conv_v.copy_(torch.randn(conv_v.shape).to(dtype))
    ssm_v.copy_(torch.randn(ssm_v.shape).to(state_dtype) * 0.1)
    conv_c, ssm_c = conv_v.contiguous(), ssm_v.contiguous()
    before = raw.clone()

    table = torch.arange(1, 1 + 4 * 5, dtype=torch.int32).view(4, 5)  # block 0 is vLLM's null
    n, q = [B, 5, B + 10], [1, 1, 2 * B + 7]  # decode across, decode inside, warm prefill
    qsl = np.concatenate([[0], np.cumsum(q)])
    p = DeviceTablePlanner(4, 512, B, table.stride(0), table.shape[1])
    step = p.plan(qsl, np.array(n), table[:3])
    T = int(qsl[-1]) + 3  # three padding tokens
    x = torch.randn(T, C).to(dtype)
    a, b = torch.randn(T, HV).to(dtype), torch.randn(T, HV).to(dtype)
    w = torch.randn(C, W).to(dtype) * 0.5
    A_log, dt_bias = torch.rand(HV), torch.randn(HV).to(dtype)  # vLLM: dt_bias in model dtype
    outs = []
    for conv, ssm in ((conv_v, ssm_v), (conv_c, ssm_c)):
        o = torch.zeros(T, HV, V, dtype=dtype)
        run_gdn_core(x, a, b, GDNWeights(w, None, A_log, dt_bias), GDNPools(conv, ssm), step, o)
        outs.append(o)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][-3:], torch.zeros_like(outs[0][-3:]))
    assert torch.equal(conv_v, conv_c) and torch.equal(ssm_v, ssm_c)
    # exactly the blocks the step writes changed: decode writes, prefill checkpoints + write
    written = {step.decode_write[0].item(), step.decode_write[1].item(),
               *step.prefill.ckpt_slots.tolist(), step.prefill.write_slot[0].item()} - {-1}
    assert written == {table[0, 1].item(), table[1, 0].item(), table[2, 1].item(),
                       table[2, 2].item(), table[2, 3].item()}
    page = raw.numel() // nb
    changed = {i for i in range(nb) if not torch.equal(raw[i * page:(i + 1) * page],
                                                       before[i * page:(i + 1) * page])}
    assert changed == written


def test_warm_up_launches_once_and_touches_no_slot():
    from gdn_graphs.vllm import warmup

    w = torch.randn(C, W)
    args = (HK, HV, K, V, w, torch.rand(HV), torch.randn(HV), torch.float32, torch.float32)
    done = set()
    assert warmup.warm_up_kernels(*args, done=done) is True
    assert warmup.warm_up_kernels(*args, done=done) is False  # once per shapes/dtypes/layouts
    assert warmup.warm_up_kernels(*args, done=set()) is True   # the record is the caller's
    with pytest.raises(ValueError, match="channels"):
        warmup.warm_up_kernels(HK, HV, K, V + 1, w, *args[5:])


@pytest.mark.parametrize("dim_first", [False, True])
def test_kernel_conv_view_is_the_first_window_positions_of_vllms_state(dim_first):
    """vLLM's conv state with speculative decoding has W - 1 + k positions; the kernels get the
    first W - 1 as a view (writes through it land in vLLM's tensor, the other k stay)."""
    from gdn_graphs.vllm.v0_26.pages import kernel_conv_view

    k = 2
    state = torch.randn(5, C, W - 1 + k) if dim_first else torch.randn(5, W - 1 + k, C)
    keep = state.clone()
    view = kernel_conv_view(state, W, dim_first)
    assert view.shape == (5, C, W - 1)
    want = keep if dim_first else keep.transpose(-1, -2)
    assert torch.equal(view, want[..., :W - 1])
    view.fill_(7.0)
    rest = state[..., W - 1:] if dim_first else state[:, W - 1:, :]
    assert torch.equal(rest, keep[..., W - 1:] if dim_first else keep[:, W - 1:, :])
    with pytest.raises(ValueError, match="conv state of 2 positions"):
        kernel_conv_view(torch.zeros(5, C, 2), W, True)
