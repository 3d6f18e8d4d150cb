# one-off device probe of the fifteenth stop: conv_decode and the FlashInfer path's gather and
# scatter, timed on whichever gdn_graphs is first on PYTHONPATH (run once with the tree before the
# flat grids, .old/, and once with this one). TP 1 heads, bf16 conv pool, fp32 state pool, pools
# with more slots than rows (read != write), graph-free do_bench medians.
import json, os, sys, torch, triton
import gdn_graphs.ops.conv as conv
from gdn_graphs.ops.fi_kernels import fi_gather, fi_scatter
from gdn_graphs.ops.fi_prefill import FiWorkspace
from gdn_graphs.ops.meta import chunk_meta
torch.manual_seed(0)
HK, HV, K, V, W = 16, 32, 128, 128, 4
C = 2 * HK * K + HV * V
dev = "cuda"
res = {"tree": os.environ.get("TREE", "?")}
ms = lambda f: triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")
for B in (64, 256, 1024):
    x = torch.randn(B, C, device=dev, dtype=torch.bfloat16)
    w = torch.randn(C, W, device=dev, dtype=torch.bfloat16)
    pool = torch.randn(4 * B, C, W - 1, device=dev, dtype=torch.bfloat16)
    perm = torch.randperm(4 * B, device=dev).to(torch.int32)
    rs, ws_ = perm[:B].contiguous(), perm[B:2 * B].contiguous()
    y = torch.empty_like(x)
    f = lambda: conv.conv_decode(x, w, None, pool, rs, ws_, out=y)
    t = ms(f)
    nbytes = 2 * B * C * (W - 1) * 2 + 2 * B * C * 2
    res[f"conv_decode_B{B}_us"] = t * 1e3
    res[f"conv_decode_B{B}_TBps"] = nbytes / t / 1e9
for nseq, L in ((8, 2048), (4, 16384)):
    T, Bk = nseq * L, 256
    nck = L // Bk - 1
    need = nck + 1
    ssm = torch.zeros(nseq * need + 8, HV, V, K, device=dev)
    writes = [i * need for i in range(nseq)]
    ckpts = [[i * need + 1 + e for e in range(nck)] for i in range(nseq)]
    meta = chunk_meta([L] * nseq, [0] * nseq, [-1] * nseq, writes, ckpts, Bk, device=dev)
    fw = FiWorkspace(T, nseq, HK, HV, K, V, torch.bfloat16, dev, max_checkpoints=T // 256)
    fw.cu64[:nseq + 1] = torch.arange(nseq + 1, device=dev) * L
    fw.ckcu[:nseq + 1] = torch.arange(nseq + 1, device=dev) * (L // 256)
    n_ck = T // 256
    g = lambda: fi_gather(ssm, fw, meta, nseq)
    s = lambda: fi_scatter(ssm, fw, meta, nseq, n_ck, 256)
    st = HV * V * K * 4
    res[f"gather_{nseq}x{L}_us"] = ms(g) * 1e3
    t = ms(s)
    res[f"scatter_{nseq}x{L}_us"] = t * 1e3
    # bytes the scatter moves: every checkpoint read (FlashInfer's, all of them), the block ones
    # and the finals written
    res[f"scatter_{nseq}x{L}_TBps"] = ((n_ck + nseq) * st + (nseq * nck + nseq) * st) / t / 1e9
print(json.dumps(res))
