"""A pure-torch chunk_gated_delta_rule with FlashInfer 0.6.14's contract (flashinfer.gdn_prefill),
injected into gdn_fi_prefill where FlashInfer would run: the CPU tier tests our prep, gather,
alignment and scatter against it.

Contract (read from FlashInfer's source, gdn_prefill.py and delta_rule_sm90.py): q, k [T, H, D]
already l2-normalised, v [T, HV, D], all contiguous and of one 16-bit dtype; g = alpha = exp(log
decay) and beta [T, HV] fp32 contiguous; cu_seqlens int64 [N + 1]; initial_state and output_state
[N, HV, V, K] fp32 contiguous (output_state may alias initial_state: each (sequence, head) is read
before it is written); output [T, HV, V] of q's dtype, only the sequences' rows written;
state_checkpoints [C, HV, V, K] fp32 and checkpoint_cu_starts int64 [N + 1]: sequence i's
checkpoint j (the state after (j + 1) * every tokens of its span, j < len_i // every) goes to
row checkpoint_cu_starts[i] + j. Empty sequences are skipped entirely (no state written).

Arithmetic: token by token in fp32, so a checkpoint is exactly the carried state and a run from
it repeats the carried arithmetic (the property the real kernel has per chunk).
"""

from __future__ import annotations

import torch


def _check(q, k, v, g, beta, cu, h0, out, hT, ck, ck_cu, every, use_cp):
    assert use_cp is False, "checkpoints need use_cp=False"
    for name, t in dict(q=q, k=k, v=v, g=g, beta=beta, cu=cu, h0=h0, out=out, hT=hT, ck=ck,
                        ck_cu=ck_cu).items():
        assert t.is_contiguous(), f"{name} must be contiguous"
    assert q.dtype == k.dtype == v.dtype == out.dtype and q.dtype in (torch.bfloat16, torch.float16)
    assert g.dtype == beta.dtype == h0.dtype == hT.dtype == ck.dtype == torch.float32
    assert cu.dtype == ck_cu.dtype == torch.int64
    n = cu.shape[0] - 1
    HV, V, K = v.shape[1], v.shape[2], q.shape[2]
    assert tuple(h0.shape) == tuple(hT.shape) == (n, HV, V, K) and ck_cu.shape[0] == n + 1
    assert tuple(ck.shape[1:]) == (HV, V, K) and every > 0 and every % 64 == 0
    assert tuple(out.shape) == (q.shape[0], HV, V) and tuple(g.shape) == tuple(beta.shape) == (q.shape[0], HV)


def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                           output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                           output=None, output_state=None, state_checkpoints=None,
                           checkpoint_cu_starts=None, checkpoint_every_n_tokens=0, use_cp="auto",
                           ckpt_shift=0):
    """The stand-in. ``ckpt_shift`` (tests only) stores checkpoint j one row later: a broken
    FlashInfer that the orchestration tests must catch."""
    _check(q, k, v, g, beta, cu_seqlens, initial_state, output, output_state, state_checkpoints,
           checkpoint_cu_starts, checkpoint_every_n_tokens, use_cp)
    assert not use_qk_l2norm_in_kernel and initial_state is not None and output_final_state
    HV, G = v.shape[1], v.shape[1] // q.shape[1]
    every = checkpoint_every_n_tokens
    cu = cu_seqlens.tolist()
    total = state_checkpoints.shape[0]
    for i in range(len(cu) - 1):
        bos, eos = cu[i], cu[i + 1]
        if eos <= bos:
            continue
        S = initial_state[i].clone()  # [HV, V, K] fp32
        qi = q[bos:eos].float().repeat_interleave(G, 1)
        ki = k[bos:eos].float().repeat_interleave(G, 1)
        vi, ai, bi = v[bos:eos].float(), g[bos:eos], beta[bos:eos]
        for t in range(eos - bos):
            S = S * ai[t][:, None, None]
            pred = torch.einsum("hvk,hk->hv", S, ki[t])
            S = S + torch.einsum("hv,hk->hvk", bi[t][:, None] * (vi[t] - pred), ki[t])
            output[bos + t] = (torch.einsum("hvk,hk->hv", S, qi[t]) * scale).to(output.dtype)
            if (t + 1) % every == 0:
                row = int(checkpoint_cu_starts[i]) + (t + 1) // every - 1
                assert row < total, "checkpoint row past state_checkpoints"
                row = (row + ckpt_shift) % total
                state_checkpoints[row] = S
        output_state[i] = S
    return output, output_state
