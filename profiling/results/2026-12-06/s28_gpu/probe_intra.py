"""GPU probe (twenty-eighth stop): the Gluon chunk-parallel kernel with the inverse's sweeps run
transposed (T^T in registers as the tf32 A operand, no transposed shared-memory stores) and P / T'
stored through a coalesced layout, against the twenty-seventh stop's (main at eff3ad0, read with
``git show``; the calls ran a copy of that file kept beside this one, removed since), a variant storing P straight from the wgmma layout (generated from the
library's source), and the Triton kernel.

    PYTHONPATH=. python3 profiling/results/2026-12-06/s28_gpu/probe_intra.py   # JSON to $OUT

Numerics: per workspace field, bit-equal fraction and relative error against the Triton kernel's
(and T' against the s27 kernel's). Speed: median ms (do_bench) of each kernel alone and of the whole
library prefill (a state every 256 tokens into pool slots), bf16 inputs, HV 32 / HK 16 (TP 1) and
16 / 8 (TP 2).
"""

import importlib.util
import json
import os
import subprocess

import torch
import triton

from gdn_graphs.ops import chunk_intra_gluon as NEW
from gdn_graphs.ops.chunk import chunk_intra_fwd, gdn_chunk_prefill
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.meta import chunk_meta, num_checkpoints
from gdn_graphs.ops.workspace import ChunkWorkspace, chunk_config

K = V = 128
DEV = "cuda"
REPORT = {"device": torch.cuda.get_device_name(), "numerics": [], "timings": []}


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pdirect_variant():
    """The library's kernel with P stored straight from the wgmma layout (the s27 way); call 1's
    library kernel stored P through the coalesced layout, the committed one (call 4) stores it
    straight, and then this is the library's kernel."""
    src = open(NEW.__file__).read()
    old = ("gl.store(p_ws + rowo[:, None] * (HV * BC) + i_h * BC + co[None, :],\n"
           "                     gl.convert_layout((dec * QK).to(p_ws.dtype.element_ty), LO), mask=mo[:, None])")
    if old not in src:
        return NEW
    src = src.replace(old, "gl.store(p_ws + (cs + rr).to(gl.int64)[:, None] * (HV * BC) + i_h * BC + cc[None, :], "
                      "(dec * QK).to(p_ws.dtype.element_ty), mask=(rr < n_t)[:, None])")
    path = "/tmp/intra_gluon_pdirect.py"
    open(path, "w").write(src)
    return load(path, "intra_gluon_pdirect")


def s27_kernel():
    path = "/tmp/intra_gluon_s27.py"
    with open(path, "w") as f:
        f.write(subprocess.run(["git", "show", "eff3ad0:gdn_graphs/ops/chunk_intra_gluon.py"], check=True,
                               capture_output=True, text=True).stdout)
    return load(path, "intra_gluon_s27")


VARIANTS = {"s27": s27_kernel(), "new": NEW,
            "new_pdirect": pdirect_variant()}


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
    names = ["triton", *VARIANTS]
    wss = {n: ChunkWorkspace(c["T"], c["HV"], K, V, torch.bfloat16, DEV, HK=c["HK"]) for n in names}
    out = torch.empty(c["T"], c["HV"], V, device=DEV, dtype=torch.bfloat16)
    args = (c["q"], c["k"], c["a"], c["b"], c["A_log"], c["dt_bias"], out)
    fns = {"triton": lambda: chunk_intra_fwd(*args, wss["triton"], c["meta"], K ** -0.5, num_warps=4,
                                             dot_precision="tf32", inv_precision="tf32")}
    for n, mod in VARIANTS.items():
        fns[n] = (lambda mod=mod, ws=wss[n]: mod.chunk_intra_fwd_gluon(*args, ws, c["meta"], K ** -0.5))
    return fns, wss, out


def ms(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main():
    print(REPORT["device"])
    for HK, HV in ((16, 32), (8, 16)):
        c = case(8, 2048, HK, HV)
        assert NEW.gluon_intra_supported(c["q"], V)
        fns, wss, out = launchers(c)
        for n, fn in fns.items():
            for t in (wss[n].t, wss[n].p, wss[n].g, wss[n].qs, wss[n].kn):
                t.fill_(float("nan"))
            fn()
        torch.cuda.synchronize()
        for variant in VARIANTS:
            for ref in ("triton", "s27"):
                for name in ("qs", "kn", "g", "p", "t"):
                    if ref == "s27" and name != "t":
                        continue
                    x, y = getattr(wss[ref], name).float(), getattr(wss[variant], name).float()
                    d = dict(tp=1 if HV == 32 else 2, variant=variant, ref=ref, field=name,
                             bits_equal=(x == y).float().mean().item(), differ=int((x != y).sum().item()),
                             rel=((x - y).norm() / x.norm()).item(), nan=bool(torch.isnan(y).any().item()))
                    REPORT["numerics"].append(d)
                    print(f"  TP{d['tp']} {variant} vs {ref} {name}: bit-equal {d['bits_equal']:.6f} "
                          f"({d['differ']} differ) rel {d['rel']:.2e} nan {d['nan']}")
    print(f"{'tp':>3} {'shape':>9} {'triton':>8} {'s27':>8} {'new':>8} {'new_pdir':>8} {'s27/new':>8} "
          f"{'prefill':>8}")
    for HK, HV in ((16, 32), (8, 16)):
        for nseq, L in ((1, 8192), (8, 2048), (32, 512), (4, 16384)):
            c = case(nseq, L, HK, HV)
            fns, wss, out = launchers(c)
            cfg = chunk_config(nseq, torch.bfloat16, HV, gluon_seq_supported(c["v"], K))
            pre = lambda: gdn_chunk_prefill(c["q"], c["k"], c["v"], c["a"], c["b"], c["A_log"], c["dt_bias"],
                                            c["pool"], c["meta"], out=out, workspace=wss["triton"], config=cfg)
            d = dict(tp=1 if HV == 32 else 2, shape=f"{nseq}x{L}", T=c["T"], seq_kernel=cfg.seq_kernel,
                     **{n: ms(fn) for n, fn in fns.items()}, prefill=ms(pre))
            REPORT["timings"].append(d)
            print(f"{d['tp']:>3} {d['shape']:>9} {d['triton']:8.3f} {d['s27']:8.3f} {d['new']:8.3f} "
                  f"{d['new_pdirect']:8.3f} {d['s27'] / d['new']:8.2f} {d['prefill']:8.3f}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_intra.json"), "w") as f:
        json.dump(REPORT, f, indent=1)


if __name__ == "__main__":
    main()
