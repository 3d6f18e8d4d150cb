"""Plain PyTorch GatedDeltaNet and causal conv1d: the truth every kernel is tested against.

Nothing here is fast. Every input and every state is an explicit argument or result, and all
arithmetic happens in ``dtype`` (float64 by default), so a test can compare a kernel's output and
the states it stored with one call.

Shapes (one sequence, T tokens):
    q, k      [T, HK, K]      key heads HK; HV is a multiple of HK (grouped value heads)
    v         [T, HV, V]
    a, b      [T, HV]         pre-activation gate inputs
    A_log     [HV]            g = -exp(A_log) * softplus(a + dt_bias)   (log decay per token)
    dt_bias   [HV]            beta = sigmoid(b)
    state     [HV, V, K]      the recurrent state S, so that o = S @ q
The update for each token and value head h (key head h // (HV // HK)):
    q <- l2norm(q) * scale,  k <- l2norm(k),  scale = K ** -0.5 by default
    S <- exp(g) * S
    S <- S + beta * (v - S @ k) outer k
    o <- S @ q
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gdn_gating", "l2norm", "gdn_recurrent_ref", "causal_conv1d_ref"]


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, dtype=torch.float64):
    """Log decay per token and value head: g = -exp(A_log) * softplus(a + dt_bias)."""
    return -torch.exp(A_log.to(dtype)) * F.softplus(a.to(dtype) + dt_bias.to(dtype))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension (the convention of FLA and vLLM)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_recurrent_ref(
    q, k, v, a, b, A_log, dt_bias, state=None, scale=None, dtype=torch.float64,
    return_all_states=False,
):
    """Token-by-token GDN for one sequence.

    Returns (o [T, HV, V], final state [HV, V, K]) in ``dtype``; with ``return_all_states`` also
    the state after each token, [T, HV, V, K] (index t holds the state after t + 1 tokens).
    ``state=None`` starts from zeros. Inputs are not modified.
    """
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    assert HV % HK == 0, "HV must be a multiple of HK"
    scale = K ** -0.5 if scale is None else scale
    group = HV // HK
    qn = l2norm(q.to(dtype)).repeat_interleave(group, dim=1) * scale
    kn = l2norm(k.to(dtype)).repeat_interleave(group, dim=1)
    vd = v.to(dtype)
    g = gdn_gating(A_log, a, dt_bias, dtype)
    beta = torch.sigmoid(b.to(dtype))
    S = torch.zeros(HV, V, K, dtype=dtype) if state is None else state.to(dtype).clone()
    S = S.to(q.device)
    o = torch.empty(T, HV, V, dtype=dtype, device=q.device)
    states = []
    for t in range(T):
        S = S * torch.exp(g[t])[:, None, None]
        pred = torch.einsum("hvk,hk->hv", S, kn[t])
        S = S + torch.einsum("hv,hk->hvk", beta[t][:, None] * (vd[t] - pred), kn[t])
        o[t] = torch.einsum("hvk,hk->hv", S, qn[t])
        if return_all_states:
            states.append(S.clone())
    if return_all_states:
        return o, S, torch.stack(states) if states else S.new_zeros(0, HV, V, K)
    return o, S


def causal_conv1d_ref(x, weight, bias=None, window=None, activation="silu", dtype=torch.float64,
                      return_all_windows=False):
    """Causal depthwise conv1d over one sequence, continuing from a window of earlier inputs.

    x [T, C]; weight [C, W]; bias [C] or None; window [C, W-1] (the last W-1 inputs before x,
    oldest first) or None for zeros. y[t, c] = act(bias[c] + sum_j weight[c, j] * xx[t + j, c])
    where xx is the window followed by x. Returns (y [T, C], final window [C, W-1]) in ``dtype``;
    with ``return_all_windows`` also the window after each token, [T, C, W-1].
    """
    T, C = x.shape
    W = weight.shape[1]
    if window is None:
        window = torch.zeros(C, W - 1, dtype=dtype, device=x.device)
    xx = torch.cat([window.to(dtype).t(), x.to(dtype)], dim=0)  # [W-1+T, C]
    w = weight.to(dtype)
    y = torch.zeros(T, C, dtype=dtype, device=x.device)
    for j in range(W):
        y += xx[j:j + T] * w[:, j]
    if bias is not None:
        y += bias.to(dtype)
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    final = xx[T:].t().contiguous()
    if return_all_windows:
        windows = torch.stack([xx[t + 1:t + W].t() for t in range(T)]) if T else xx.new_zeros(0, C, W - 1)
        return y, final, windows
    return y, final

