"""GPU probe: the Gluon sequential kernel (gluon_seq.py) against the library's _chunk_seq_kernel on
one ChunkWorkspace, for correctness and speed (twenty-fifth stop; twenty-sixth: the rounding order
fixed, the question is now whether the two give the same bits). Not a test of the library.

    PYTHONPATH=. python3 profiling/results/2026-12-05/s25_gpu/probe_gluon_seq.py   # JSON to $OUT

Correctness: both seq kernels run after the same chunk_intra_fwd; outputs and every slot written
are compared (bit-equal fraction, relative error); warm == cold for the Gluon kernel (a run
resumed from its own checkpoint must give the cold run's bits). Speed: median ms (do_bench) of the
intra kernel, each seq kernel alone, and intra + seq, a state every 256 tokens into pool slots.
"""

import json
import os
import sys
import traceback

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_seq import gluon_seq_fwd  # noqa: E402

from gdn_graphs.ops.chunk import chunk_intra_fwd, chunk_seq_fwd  # noqa: E402
from gdn_graphs.ops.chunk_gluon import chunk_seq_fwd_gluon  # noqa: E402
from gdn_graphs.ops.meta import chunk_meta, num_checkpoints  # noqa: E402
from gdn_graphs.ops.workspace import ChunkWorkspace, chunk_config  # noqa: E402

K = V = 128
VARIANTS = {"g128": dict(bv=128), "g64": dict(bv=64), "g64d": dict(bv=64, o_direct=True),
            "g128d": dict(bv=128, o_direct=True),
            # the library's copy (gdn_graphs.ops.chunk_gluon), with an error flag
            "lib128": dict(bv=128, lib=True), "lib64": dict(bv=64, lib=True)}
DEV = "cuda"
RUNS = []
REPORT = {"device": torch.cuda.get_device_name(), "checks": [], "timings": []}


def inputs(T, HK, HV, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    bf = torch.bfloat16
    qkv = torch.randn(T, 2 * HK * K + HV * V, device=DEV, generator=g, dtype=bf)
    q = qkv[:, :HK * K].unflatten(1, (HK, K))
    k = qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
    v = qkv[:, 2 * HK * K:].unflatten(1, (HV, V))
    ab = torch.randn(T, 2 * HV, device=DEV, generator=g, dtype=bf)
    A_log = torch.log(torch.empty(HV, device=DEV).uniform_(1, 16, generator=g))
    dt_bias = torch.randn(HV, device=DEV, generator=g) * 0.5
    return q, k, v, ab[:, :HV], ab[:, HV:], A_log, dt_bias


class Run:
    """One batch: inputs, a filled workspace (chunk_intra_fwd), a pool."""

    def __init__(self, seqlens, starts, reads, HK, HV, pool_dtype, B=256, seed=0, num_slots=None):
        self.T = sum(seqlens)
        self.HK, self.HV = HK, HV
        self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias = inputs(self.T, HK, HV, seed)
        nck = [num_checkpoints(s, L, B) for s, L in zip(starts, seqlens)]
        nxt = 1 + max([r for r in reads if r >= 0], default=-1)
        writes, ckpts = [], []
        for n in nck:
            writes.append(nxt)
            ckpts.append(list(range(nxt + 1, nxt + 1 + n)))
            nxt += 1 + n
        self.num_slots = num_slots or nxt
        self.meta = chunk_meta(seqlens, starts, reads, writes, ckpts, B, device=DEV)
        g = torch.Generator(device=DEV).manual_seed(seed + 1)
        self.pool0 = (torch.randn(self.num_slots, HV, V, K, device=DEV, generator=g) * 0.1).to(pool_dtype)
        self.ws = ChunkWorkspace(self.T, HV, K, V, torch.bfloat16, DEV, HK=HK)
        self.out = torch.empty(self.T, HV, V, device=DEV, dtype=torch.bfloat16)
        self.cfg = chunk_config(len(seqlens), torch.bfloat16)
        self.flag = torch.zeros(1, dtype=torch.int32, device=DEV)

    def intra(self):
        chunk_intra_fwd(self.q, self.k, self.a, self.b, self.A_log, self.dt_bias, self.out, self.ws,
                        self.meta, K ** -0.5, num_warps=self.cfg.warps_intra, dot_precision="tf32",
                        inv_precision="tf32")

    def seq_triton(self, out, pool):
        chunk_seq_fwd(out, self.v, pool, self.ws, self.meta, self.HK, bv=self.cfg.bv,
                      num_warps=self.cfg.warps_seq, num_stages=self.cfg.stages_for(torch.bfloat16),
                      dot_precision="tf32")

    def seq_gluon(self, out, pool, variant="g128"):
        kw = dict(VARIANTS[variant])
        if kw.pop("lib", False):
            chunk_seq_fwd_gluon(out, self.v, pool, self.ws, self.meta, self.HK, error_flag=self.flag, **kw)
        else:
            gluon_seq_fwd(out, self.v, pool, self.ws, self.meta, self.HK, **kw)

    def both(self, pool=None):
        """(out, pool) after each seq kernel, from the same workspace and starting pool."""
        self.intra()
        res = []
        fns = [self.seq_triton] + [(lambda o, p, n=n: self.seq_gluon(o, p, n)) for n in VARIANTS]
        for fn in fns:
            out = torch.full_like(self.out, float("nan"))
            p = self.pool0.clone() if pool is None else pool.clone()
            fn(out, p)
            torch.cuda.synchronize()
            res.append((out, p))
        return res


def compare(name, ref, got):
    (o1, p1), (o2, p2) = ref, got
    d = {"name": name}
    for what, x, y in (("out", o1, o2), ("pool", p1, p2)):
        x, y = x.float(), y.float()
        d[f"{what}_nan"] = bool(torch.isnan(y).any().item())
        d[f"{what}_bits_equal_frac"] = (x == y).float().mean().item()
        d[f"{what}_rel"] = ((x - y).norm() / x.norm().clamp_min(1e-30)).item()
        d[f"{what}_max_abs"] = (x - y).abs().max().item()
    # bf16 operands with fp32 accumulation: the two kernels may sum in another order
    d["passed"] = (not d["out_nan"]) and (not d["pool_nan"]) and d["out_rel"] < 2e-2 and d["pool_rel"] < 2e-2
    print(f"  {name}: out rel {d['out_rel']:.2e} eq {d['out_bits_equal_frac']:.4f} | pool rel "
          f"{d['pool_rel']:.2e} eq {d['pool_bits_equal_frac']:.4f} {'PASS' if d['passed'] else 'FAIL'}")
    REPORT["checks"].append(d)
    return d["passed"]


def compare_all(name, res):
    """Each Gluon variant against the Triton kernel; the variants against g128 bit for bit."""
    ok = True
    ref, g = res[0], dict(zip(VARIANTS, res[1:]))
    print(f"  {name}: error flag after the library kernel: {int(RUNS[-1].flag.item())}")
    ok &= int(RUNS[-1].flag.item()) == 0
    for n, got in g.items():
        ok &= compare(f"{name} {n}", ref, got)
    same = {n: torch.equal(g[n][0], g["g128"][0]) and torch.equal(g[n][1], g["g128"][1]) for n in g}
    print(f"  {name}: variants equal to g128 bit for bit: {same}")
    REPORT["checks"].append(dict(name=f"{name} variants == g128", same=same))
    return ok


def checks():
    ok = True
    for HK, HV in ((16, 32), (8, 16)):
        for pdt in (torch.float32, torch.bfloat16):
            tag = f"HV{HV} {str(pdt)[6:]}"
            r = Run([2048] * 8, [0] * 8, [-1] * 8, HK, HV, pdt)
            RUNS.append(r)
            ok &= compare_all(f"8x2048 {tag}", r.both())
            # mixed: mid-chunk and mid-block starts, read slots, short and long spans
            r = Run([300, 1000, 64, 2049, 1, 130], [0, 320, 100, 512, 7, 256], [-1, 0, 1, 2, 3, 4],
                    HK, HV, pdt, seed=3)
            RUNS.append(r)
            ok &= compare_all(f"mixed {tag}", r.both())
    RUNS.clear()
    # warm == cold: resume at 512 from the cold run's checkpoint of 512, the cold and warm runs on
    # the given kernels (Gluon / Gluon; Triton / Gluon and Gluon / Triton: routes mixed)
    for pdt, cold_k, warm_k in ((torch.float32, "gluon", "gluon"), (torch.bfloat16, "gluon", "gluon"),
                                (torch.float32, "triton", "gluon"), (torch.bfloat16, "triton", "gluon"),
                                (torch.float32, "gluon", "triton"), (torch.bfloat16, "gluon", "triton")):
        L, HK, HV = 1024, 16, 32
        cold = Run([L], [0], [-1], HK, HV, pdt, seed=5)
        cold.intra()
        pool = cold.pool0.clone()
        out_c = torch.empty_like(cold.out)
        (cold.seq_gluon if cold_k == "gluon" else cold.seq_triton)(out_c, pool)
        ck512 = cold.meta.ckpt_slots[1].item()  # states after 256, 512, 768: entry 1 is 512
        warm = Run([L - 512], [512], [ck512], HK, HV, pdt, seed=5, num_slots=pool.shape[0] + 8)
        warm.q, warm.k, warm.v = cold.q[512:], cold.k[512:], cold.v[512:]
        warm.a, warm.b, warm.A_log, warm.dt_bias = cold.a[512:], cold.b[512:], cold.A_log, cold.dt_bias
        warm.intra()
        pool_w = torch.zeros(pool.shape[0] + 8, *pool.shape[1:], device=DEV, dtype=pdt)
        pool_w[:pool.shape[0]] = pool
        out_w = torch.empty_like(warm.out)
        (warm.seq_gluon if warm_k == "gluon" else warm.seq_triton)(out_w, pool_w)
        torch.cuda.synchronize()
        w_slot = warm.meta.write_slot[0].item()
        same_o = torch.equal(out_w, out_c[512:])
        same_s = torch.equal(pool_w[w_slot], pool[cold.meta.write_slot[0].item()])
        d = dict(name=f"warm({warm_k})==cold({cold_k}) {str(pdt)[6:]}", out_equal=same_o, state_equal=same_s,
                 passed=same_o and same_s)
        print(f"  {d['name']}: out {same_o} state {same_s}")
        REPORT["checks"].append(d)
        ok &= d["passed"]
    return ok


def ms(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def timings():
    rows = []
    for HK, HV in ((16, 32), (8, 16)):
        for nseq, L in ((1, 8192), (2, 4096), (8, 2048), (32, 512), (4, 16384)):
            r = Run([L] * nseq, [0] * nseq, [-1] * nseq, HK, HV, torch.float32)
            pool = r.pool0.clone()
            r.intra()
            d = dict(tp=1 if HV == 32 else 2, shape=f"{nseq}x{L}", T=r.T,
                     intra=ms(r.intra),
                     seq_triton=ms(lambda: r.seq_triton(r.out, pool)),
                     **{n: ms(lambda n=n: r.seq_gluon(r.out, pool, n)) for n in VARIANTS})
            d["seq_gluon"] = min(d[n] for n in VARIANTS)
            d["best"] = min(VARIANTS, key=lambda n: d[n])
            d["all_triton"] = ms(lambda: (r.intra(), r.seq_triton(r.out, pool)))
            d["all_gluon"] = ms(lambda: (r.intra(), r.seq_gluon(r.out, pool, d["best"])))
            d["Mtok_triton"] = r.T / d["all_triton"] / 1e3
            d["Mtok_gluon"] = r.T / d["all_gluon"] / 1e3
            print(f"  TP{d['tp']} {d['shape']:>8}: intra {d['intra']:.3f}  seq triton {d['seq_triton']:.3f} "
                  + " ".join(f"{n} {d[n]:.3f} ({d['seq_triton'] / d[n]:.2f}x)" for n in VARIANTS) +
                  f" | best {d['best']}  all {d['all_triton']:.3f}"
                  f" -> {d['all_gluon']:.3f} ms ({d['Mtok_triton']:.1f} -> {d['Mtok_gluon']:.1f} M tok/s)")
            REPORT["timings"].append(d)
            rows.append(d)
            del r, pool
            torch.cuda.empty_cache()
    return rows


def main():
    ok = True
    print("checks (Gluon against the library's seq kernel on one workspace)")
    try:
        ok &= checks()
    except Exception as e:
        traceback.print_exc()
        REPORT["check_error"] = repr(e)[:500]
        ok = False
    print("timings (ms, median; a state every 256 tokens into pool slots, fp32 pool)")
    try:
        timings()
    except Exception as e:
        traceback.print_exc()
        REPORT["timing_error"] = repr(e)[:500]
        ok = False
    REPORT["ok"] = ok
    cmp = [c for c in REPORT["checks"] if "out_bits_equal_frac" in c]
    exact = [c["name"] for c in cmp if c["out_bits_equal_frac"] == 1.0 and c["pool_bits_equal_frac"] == 1.0]
    REPORT["bit_equal_to_triton"] = len(exact) == len(cmp) and len(cmp) > 0
    print(f"bit-equal to the Triton kernel (outputs and every slot): {len(exact)} of {len(cmp)} checks")
    path = os.path.join(os.environ.get("OUT", "/tmp"), "probe_gluon_seq.json")
    with open(path, "w") as f:
        json.dump(REPORT, f, indent=1)
    print("wrote", path, "PROBE", "PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()
