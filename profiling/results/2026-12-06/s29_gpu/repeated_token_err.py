"""The repeated-token case of test_chunk_intra_gluon (one token, beta ~ 1, no decay): each kernel's
T' against the float64 inverse of its own A, chunk by chunk (max and summed abs error), printed.

    PYTHONPATH=.:tests python3 profiling/results/2026-12-06/s29_gpu/repeated_token_err.py
"""

import torch

import test_chunk_intra_gluon as t

got = {}


def repeat(inputs):
    q, k, v, a, b = inputs[:5]
    for x in (q, k, v):
        x.copy_(x[:1].expand_as(x))
    a.fill_(-30.0)
    b.fill_(12.0)
    got["b"] = b


seqs = [(300, 0), (150, 37)]
(w1, _, _), (w2, _, _) = t._workspaces(torch.device("cuda"), seqs, 1, 2, pad=0, seed=9, inputs_edit=repeat)
for name, ws in (("triton", w1), ("gluon", w2)):
    rows_out = []
    for rows, h, truth in t._t_truth(ws, seqs, got["b"], 1, 2):
        e = (ws.t[rows, h, :truth.shape[0]].double() - truth).abs()
        i = int(e.argmax())
        r, c = divmod(i, truth.shape[0])
        rows_out.append(f"[{rows.start}:{rows.stop}] h{h} max {e.max().item():.2e} at ({r},{c}) truth "
                        f"{truth[r, c].item():.3e} sum {e.sum().item():.3e} tmax {truth.abs().max().item():.3f}")
    print(name)
    print("\n".join("  " + x for x in rows_out))
