"""GPU probe (twenty-seventh stop): the Gluon chunk-parallel kernel (gdn_graphs.ops.chunk_intra_gluon)
against the Triton one (chunk.chunk_intra_fwd), same batch, same workspace layout.

    PYTHONPATH=. python3 profiling/results/2026-12-06/s27_gpu/probe_gluon_intra.py   # JSON to $OUT

Call 4 ran it with ``mirror.patch`` applied (beside this file: the row steps on the Triton
kernel's layout, ``chunk_intra_fwd_gluon(..., mirror=...)``), which adds the lane-layout column;
without the patch the library's kernel is the only Gluon column.

Numerics: per workspace field, the fraction of bit-equal entries and the relative error of the
Gluon kernel's against the Triton kernel's. Speed: median ms (do_bench) of each kernel alone and of
the whole library prefill (gdn_chunk_prefill, which now takes the Gluon kernel on sm_90), a state
every 256 tokens into pool slots, bf16 inputs, fp32 pool, HV 32 / HK 16 (TP 1) and 16 / 8 (TP 2).
"""

import inspect
import json
import os

import torch
import triton

from gdn_graphs.ops.chunk import chunk_intra_fwd, gdn_chunk_prefill
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon, gluon_intra_supported
from gdn_graphs.ops.meta import chunk_meta, num_checkpoints
from gdn_graphs.ops.workspace import ChunkWorkspace, chunk_config

K = V = 128
DEV = "cuda"
REPORT = {"device": torch.cuda.get_device_name(), "numerics": [], "timings": []}
MIRROR_PATCH = "mirror" in inspect.signature(chunk_intra_fwd_gluon).parameters


def case(nseq, L, HK, HV, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    T = nseq * L
    qkv = torch.randn(T, 2 * HK * K + HV * V, device=DEV, generator=g, dtype=torch.bfloat16)
    q = qkv[:, :HK * K].unflatten(1, (HK, K))
    k = qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
    v = qkv[:, 2 * HK * K:].unflatten(1, (HV, V))
    ab = torch.randn(T, 2 * HV, device=DEV, generator=g, dtype=torch.bfloat16)
    A_log = torch.log(torch.empty(HV, device=DEV).uniform_(1, 16, generator=g))
    dt_bias = torch.randn(HV, device=DEV, generator=g) * 0.5
    nck = [num_checkpoints(0, L, 256)] * nseq
    writes, ckpts, nxt = [], [], 0
    for n in nck:
        writes.append(nxt)
        ckpts.append(list(range(nxt + 1, nxt + 1 + n)))
        nxt += 1 + n
    meta = chunk_meta([L] * nseq, [0] * nseq, [-1] * nseq, writes, ckpts, 256, device=DEV)
    pool = torch.zeros(nxt, HV, V, K, device=DEV)
    return dict(q=q, k=k, v=v, a=ab[:, :HV], b=ab[:, HV:], A_log=A_log, dt_bias=dt_bias, meta=meta,
                pool=pool, T=T, HK=HK, HV=HV, nseq=nseq)


def launchers(c):
    wss = [ChunkWorkspace(c["T"], c["HV"], K, V, torch.bfloat16, DEV, HK=c["HK"]) for _ in range(2)]
    out = torch.empty(c["T"], c["HV"], V, device=DEV, dtype=torch.bfloat16)
    args = (c["q"], c["k"], c["a"], c["b"], c["A_log"], c["dt_bias"], out)
    tri = lambda: chunk_intra_fwd(*args, wss[0], c["meta"], K ** -0.5, num_warps=4, dot_precision="tf32",
                                  inv_precision="tf32")
    glu = lambda: chunk_intra_fwd_gluon(*args, wss[1], c["meta"], K ** -0.5)
    # call 4: the row steps on the Triton kernel's layout (mirror, the default) or a lane per column
    glu_lane = lambda: chunk_intra_fwd_gluon(*args, wss[1], c["meta"], K ** -0.5, mirror=False)
    return tri, glu, wss, out, (glu_lane if MIRROR_PATCH else glu)


def ms(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main():
    print(REPORT["device"])
    for HK, HV in ((16, 32), (8, 16)):
        c = case(8, 2048, HK, HV)
        assert gluon_intra_supported(c["q"], V)
        tri, glu, wss, out, glu_lane = launchers(c)
        tri()
        # (call 2 also ran the kernel capped at 128 registers, launched directly with maxnreg=128)
        for variant, fn in ((("gluon mirror", glu), ("gluon lane", glu_lane)) if MIRROR_PATCH else (("gluon", glu),)):
            wss[1].t.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            for name in ("qs", "kn", "g", "p", "t"):
                x, y = getattr(wss[0], name).float(), getattr(wss[1], name).float()
                d = dict(tp=1 if HV == 32 else 2, variant=variant, field=name, bits_equal=(x == y).float().mean().item(),
                         differ=int((x != y).sum().item()), rel=((x - y).norm() / x.norm()).item(),
                         nan=bool(torch.isnan(y).any().item()))
                REPORT["numerics"].append(d)
                print(f"  TP{d['tp']} {variant} {name}: bit-equal {d['bits_equal']:.6f} ({d['differ']} differ) "
                      f"rel {d['rel']:.2e} nan {d['nan']}")
    print(f"{'tp':>3} {'shape':>9} {'intra tri':>10} {'intra glu':>10} {'x':>6} {'glu lane':>9} {'prefill':>9} "
          f"{'seq kernel':>10}")
    for HK, HV in ((16, 32), (8, 16)):
        for nseq, L in ((1, 8192), (2, 4096), (8, 2048), (32, 512), (4, 16384)):
            c = case(nseq, L, HK, HV)
            tri, glu, wss, out, glu_lane = launchers(c)
            cfg = chunk_config(nseq, torch.bfloat16, HV, gluon_seq_supported(c["v"], K))
            pre = lambda: gdn_chunk_prefill(c["q"], c["k"], c["v"], c["a"], c["b"], c["A_log"], c["dt_bias"],
                                            c["pool"], c["meta"], out=out, workspace=wss[0], config=cfg)
            d = dict(tp=1 if HV == 32 else 2, shape=f"{nseq}x{L}", T=c["T"], intra_triton=ms(tri),
                     intra_gluon=ms(glu), intra_gluon_lane=ms(glu_lane), prefill=ms(pre),
                     seq_kernel=cfg.seq_kernel)
            d["gain"] = d["intra_triton"] / d["intra_gluon"]
            REPORT["timings"].append(d)
            print(f"{d['tp']:>3} {d['shape']:>9} {d['intra_triton']:10.3f} {d['intra_gluon']:10.3f} "
                  f"{d['gain']:6.2f} {d['intra_gluon_lane']:9.3f} {d['prefill']:9.3f} {d['seq_kernel']:>10}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_gluon_intra.json"), "w") as f:
        json.dump(REPORT, f, indent=1)


if __name__ == "__main__":
    main()
