"""The reference itself, checked against independent formulations."""

import torch
import torch.nn.functional as F

from gdn_graphs.ops.reference import causal_conv1d_ref, gdn_recurrent_ref, l2norm


def test_conv_matches_torch_conv1d():
    torch.manual_seed(0)
    T, C, W = 11, 6, 4
    x, w, b = torch.randn(T, C, dtype=torch.float64), torch.randn(C, W, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    win = torch.randn(C, W - 1, dtype=torch.float64)
    y, final, windows = causal_conv1d_ref(x, w, b, win, return_all_windows=True)
    xx = torch.cat([win, x.t()], dim=1)[None]  # [1, C, W-1+T]
    want = F.silu(F.conv1d(xx, w[:, None, :], b, groups=C))[0].t()
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(final, xx[0, :, -(W - 1):])
    torch.testing.assert_close(windows[-1], final)
    # resuming from any window reproduces the rest of the sequence
    y2, final2 = causal_conv1d_ref(x[5:], w, b, windows[4])
    torch.testing.assert_close(y2, y[5:])
    torch.testing.assert_close(final2, final)


def test_gdn_matches_matrix_form_without_decay_and_resumes():
    """With g = 0 and beta = 1 the delta rule is S_t = S_{t-1}(I - k k^T) + v k^T; check that
    closed form, and that resuming from an intermediate state reproduces the rest."""
    torch.manual_seed(1)
    T, HK, HV, K, V = 7, 1, 2, 4, 3
    q, k = torch.randn(T, HK, K), torch.randn(T, HK, K)
    v = torch.randn(T, HV, V)
    big = torch.full((T, HV), 1e4)
    a = torch.full((T, HV), -1e4)  # softplus(-1e4) == 0 -> g == 0
    A_log = torch.zeros(HV)
    dt = torch.zeros(HV)
    o, S, states = gdn_recurrent_ref(q, k, v, a, big, A_log, dt, return_all_states=True)
    kn = l2norm(k.double())[:, 0]
    qn = l2norm(q.double())[:, 0] * K ** -0.5
    Sm = torch.zeros(HV, V, K, dtype=torch.float64)
    for t in range(T):
        Sm = Sm @ (torch.eye(K, dtype=torch.float64) - torch.outer(kn[t], kn[t])) + torch.einsum("hv,k->hvk", v[t].double(), kn[t])
        torch.testing.assert_close(o[t], Sm @ qn[t])
    torch.testing.assert_close(S, Sm)
    o2, S2 = gdn_recurrent_ref(q[3:], k[3:], v[3:], a[3:], big[3:], A_log, dt, state=states[2])
    torch.testing.assert_close(o2, o[3:])
    torch.testing.assert_close(S2, S)
