"""GPU probe (twenty-ninth stop): where a CTA of each Gluon prefill kernel spends its time.

Copies of ``chunk_intra_gluon._intra_gluon_kernel`` and ``chunk_gluon._seq_gluon_kernel`` with
%clock64 read at phase boundaries (inline PTX; SM cycles, per CTA), generated from the library's
source by inserting lines after unique anchors (nothing else changes). The intra kernel stores a
stamp per phase and value head; the sequential kernel sums each phase over its chunks. Reported:
the median over CTAs of each phase's cycles (per value head / per chunk), the CTA's whole time,
and each kernel's time with and without the stamps (do_bench, ms) to show what they perturb.

    PYTHONPATH=. python3 profiling/results/2026-12-06/s29_gpu/probe_phases.py   # JSON to $OUT
    PYTHONPATH=. python3 profiling/results/2026-12-06/s29_gpu/probe_phases.py --compile  # CPU
"""

import importlib.util
import json
import os
import subprocess
import sys

import torch

from gdn_graphs.ops import chunk_gluon, chunk_intra_gluon

CLK = '''
    @gluon.jit
    def _clk():
        return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False,
                                         pack=1)

'''
INTRA_NS = 3 + 2 * 8 + 1  # prologue stamps, 8 per value head (G <= 2), the end
INTRA_PHASES = ["gates+g", "P store, A", "A to smem, diag", "row steps", "D build+load",
                "N (s28: A_o^T, N)", "3 sweeps", "T' store"]
SEQ_PHASES = ["copies wait", "gates", "XT,OqT", "xT, vnT", "oT, S", "out store", "ckpt"]


def stamp(i):
    return f"gl.store(stamps + pid * {INTRA_NS} + ({i}), _clk())"


def patch(src, edits):
    """Insert ``add`` after ``anchor`` (or after the first of a tuple of anchors found once)."""
    for anchors, add in edits:
        anchors = anchors if isinstance(anchors, tuple) else (anchors,)
        anchor = next((a for a in anchors if src.count(a) == 1), None)
        assert anchor is not None, anchors
        src = src.replace(anchor, anchor + add)
    return src


def intra_source(path=chunk_intra_gluon.__file__):
    """The intra kernel at ``path`` (the library's, or s28's tf32 sweeps) with stamps."""
    return intra_source_text(open(path).read())


def intra_source_text(src):
    ind, ind3 = " " * 8, " " * 12
    h = lambda k: ind3 + stamp(f"3 + jh * 8 + {k}") + "\n"
    src = patch(src, [
        ("    @gluon.jit\n    def _add(x, y):\n        return x + y\n", CLK),
        ("error_flag,\n                            T, max_seqs", ""),
        ("        n_cprog = gl.num_programs(0) // HK\n", ind + stamp(0) + "\n"),
        ("        fence_async_shared()\n        gl.thread_barrier()\n        zero = gl.zeros([BC, BC], gl.float32, L64)\n",
         ind + stamp(1) + "\n"),
        ("        KK, QK = warpgroup_mma_wait(0, deps=(KK, QK))\n", ind + stamp(2) + "\n"),
        ("            gl.store(g_ws + row1 * HV + i_h, gc1, mask=m1)\n", h(0)),
        (("            A = gl.where(cc[None, :] < rr[:, None], dec * KK * beta[:, None], 0.)\n",
          "            A = gl.where(cc[None, :] < rr[:, None], dec * kk_s.load(L64) * beta[:, None], 0.)\n"), h(1)),
        ("ad_s.slice(16 * blk, 16, 0).store(a_s.slice(16 * blk, 16, 0).slice(16 * blk, 16, 1).load(LB))\n"
         "            gl.thread_barrier()\n", h(2)),
        ("            X = _diag_inverse(ad3_s, L3)\n", h(3)),
        (("            Dt = a_s.permute((1, 0)).load(L64F)\n", "            Dt = a_s.permute((1, 0)).load(L64)\n"), h(4)),
        (("            f0_s.store(-N)\n            fence_async_shared()\n            gl.thread_barrier()\n",
          "            n_s.store((-N).to(gl.float16))\n            fence_async_shared()\n            gl.thread_barrier()\n"),
         h(5)),
        (("                Tt = warpgroup_mma(gl.convert_layout(Tt, DOTA), f0_s.permute((1, 0)), Dt)\n",
          "                Tt = warpgroup_mma(gl.convert_layout(Tt.to(gl.float16), DOTA), n_s.permute((1, 0)), Dt)\n"),
         h(6)),
        ("                     mask=mo[:, None])\n", h(7)),
    ])
    src = src.replace("error_flag,\n                            T, max_seqs", "error_flag, stamps,\n                            T, max_seqs")
    src = src.replace("meta.chunk_idx, error_flag,\n", "meta.chunk_idx, error_flag, stamps,\n")
    src = src.replace("def chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws: ChunkWorkspace, meta: ChunkMeta,\n"
                      "                          scale: float, error_flag=None):",
                      "def chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws: ChunkWorkspace, meta: ChunkMeta,\n"
                      "                          scale: float, error_flag=None, stamps=None):")
    # the end of the kernel (after the head loop): one more stamp
    src = src.replace("mask=mo[:, None])\n" + h(7), "mask=mo[:, None])\n" + h(7) + ind + stamp(INTRA_NS - 1) + "\n")
    assert "stamps," in src and src.count("_clk()") == 13
    return src


SEQ_GATES_FIRST = [  # the next chunk's gates loaded before its cp.async copies are issued (the
    # probe's first call timed ~2,300 cycles a chunk on the gates' two loads issued behind them)
    ("""            st = j % 2
            gl.thread_barrier()  # every warp is done with stage (j + 1) % 2 (chunk j - 1) and o_s
""", """            st = j % 2
            gc = gc_next
            g_last = gl_next
            gc_next, gl_next = _gates(j + 1, g_ws, bos, eos, off, nc, i_h, ct, HV, BC)
            gl.thread_barrier()  # every warp is done with stage (j + 1) % 2 (chunk j - 1) and o_s
"""),
    ("""            gc = gc_next
            g_last = gl_next
            gc_next, gl_next = _gates(j + 1, g_ws, bos, eos, off, nc, i_h, ct, HV, BC)
            eg = gl.exp(gc)
""", """            eg = gl.exp(gc)
""")]
SEQ_VARIANTS = {"gates_first": SEQ_GATES_FIRST}


def edited(module, edits):
    """``module``'s source with each (anchor, replacement) applied once."""
    src = open(module.__file__).read()
    for a, b in edits:
        assert src.count(a) == 1, a
        src = src.replace(a, b)
    return src


def seq_variant_source(edits):
    return edited(chunk_gluon, edits)


def s28_source():
    """The twenty-eighth stop's intra kernel (tf32 sweeps): the calls ran a copy of 5ce061a's file
    kept beside this script (removed after them); outside a device call, read from git."""
    path = os.path.join(os.path.dirname(__file__), "intra_s28.py")
    if os.path.exists(path):
        return open(path).read()
    return subprocess.run(["git", "show", "5ce061a:gdn_graphs/ops/chunk_intra_gluon.py"], check=True,
                          capture_output=True, text=True).stdout


def seq_source(src=None):
    src = open(chunk_gluon.__file__).read() if src is None else src
    i3 = " " * 12
    acc = lambda k: f"{i3}a{k} += _clk() - t_\n{i3}t_ = _clk()\n"
    src = patch(src, [
        ("    @gluon.jit\n    def _gates(j, g_ws", ""),
        ("        for j in range(nc):\n", ""),
        ("            st = j % 2\n", f"{i3}t_ = _clk()\n"),
        ("            fence_async_shared()      # before wgmma reads them through the async proxy\n", acc(0)),
        ("            eg = gl.exp(gc)\n", acc(1)),
        ("            XT, OqT = warpgroup_mma_wait(0, deps=(XT, OqT))\n", acc(2)),
        ("            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64)\n",
         acc(3)),
        ("            oT, S = warpgroup_mma_wait(0, deps=(oT, S))\n", acc(4)),
        ("                     o.to(out.dtype.element_ty), mask=(ro < n_t)[:, None])\n", acc(5)),
        ("                report(error_flag, bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)\n", acc(6)),
        ("        async_copy.wait_group(0)\n", ""),
    ])
    src = src.replace("    @gluon.jit\n    def _gates(j, g_ws", CLK + "    @gluon.jit\n    def _gates(j, g_ws")
    inits = "".join(f"        a{k} = _clk() * 0\n" for k in range(7)) + "        t_0 = _clk()\n"
    src = src.replace("        for j in range(nc):\n", inits + "        for j in range(nc):\n")
    pid = "(gl.program_id(1) * gl.num_programs(0) + gl.program_id(0))"
    stores = "".join(f"        gl.store(stamps + {pid} * 9 + {k}, a{k})\n" for k in range(7))
    stores += f"        gl.store(stamps + {pid} * 9 + 7, _clk() - t_0)\n        gl.store(stamps + {pid} * 9 + 8, nc.to(gl.int64))\n"
    src = src.replace("        async_copy.wait_group(0)\n", stores + "        async_copy.wait_group(0)\n")
    src = src.replace("error_flag, T, max_ckpts, num_slots, block_size",
                      "error_flag, stamps, T, max_ckpts, num_slots, block_size")
    src = src.replace("meta.ckpt_slots, error_flag, out.shape[0]", "meta.ckpt_slots, error_flag, stamps, out.shape[0]")
    src = src.replace("bv: int = 128,\n                        error_flag=None):", "bv: int = 128,\n                        error_flag=None, stamps=None):")
    assert "stamps, T, max_ckpts" in src and "error_flag, stamps, out.shape" in src and "stamps=None" in src
    return src


KK_SMEM = [  # K K^T and Q K^T kept in shared memory (fp32, read back per value head), maxnreg=168:
    # 168 registers without spills and 71.7 KB of shared memory, three CTAs an SM instead of two
    # (sm_90 compile on the CPU); the same arithmetic
    ("        KK, QK = warpgroup_mma_wait(0, deps=(KK, QK))\n",
     "        KK, QK = warpgroup_mma_wait(0, deps=(KK, QK))\n"
     "        kk_s = gl.allocate_shared_memory(gl.float32, [BC, BC], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]), KK)\n"
     "        qk_s = gl.allocate_shared_memory(gl.float32, [BC, BC], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]), QK)\n"),
    ("(dec * QK).to(p_ws.dtype.element_ty)", "(dec * qk_s.load(L64)).to(p_ws.dtype.element_ty)"),
    ("dec * KK * beta[:, None]", "dec * kk_s.load(L64) * beta[:, None]"),
    ("HAS_FLAG=error_flag is not None, num_warps=4)", "HAS_FLAG=error_flag is not None, num_warps=4, maxnreg=168)")]
ROW_STEPS_RL = [  # the diagonal blocks' forward substitution right-looking: once row j is final,
    # every later row takes its term (16 independent FMAs a step, where a left-looking step's sum
    # waits on the previous row); other bits
    ("""        r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
        for rr in gl.static_range(2, 16):
            coef = ad_s.slice(rr, 1, 1).permute((0, 2, 1)).load(L3)  # [4, 16 (j), 1]: Ad[b, rr, j]
            X = gl.where(r3 == rr, X - gl.expand_dims(gl.sum(coef * X, 1), 1), X)
""", """        r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
        for j in gl.static_range(1, 15):
            xj = gl.expand_dims(gl.max(gl.where(r3 == j, X, -float("inf")), 1), 1)
            X = X - ad_s.slice(j, 1, 2).load(L3) * xj
""")]
VARIANTS = {"kk_smem": KK_SMEM, "rl": ROW_STEPS_RL, "kk_smem+rl": KK_SMEM + ROW_STEPS_RL}


def variant_source(edits):
    return edited(chunk_intra_gluon, edits)


def load(src, name):
    path = f"/tmp/{name}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_only():
    """CPU check: both instrumented kernels compile for sm_90 (registers, spills)."""
    sys.path.insert(0, "tests")
    from sm90_compile import compile_sm90, ptxas_report
    I, S = load(intra_source(), "intra_stamped"), load(seq_source(), "seq_stamped")
    for vn, edits in VARIANTS.items():
        mod = load(variant_source(edits), "intra_" + vn.replace("+", "_"))
        k = compile_sm90(mod._intra_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BC=64),
                         {"A_log": "*fp32", "dt_bias": "*fp32", "g_ws": "*fp32", "error_flag": "*i32", "scale": "fp32"},
                         {"cu_seqlens", "start_pos", "chunk_seq", "chunk_idx"}, {"T", "max_seqs", "max_chunks"}, True, 4)
        print(vn, "regs, spills", ptxas_report(k), "smem", k.metadata.shared, "(maxnreg not applied here)")
    meta = {"cu_seqlens", "start_pos", "chunk_seq", "chunk_idx", "read_slot", "write_slot", "ckpt_offsets",
            "ckpt_slots"}
    for name, fn, consts, special, ints in [
        ("intra", I._intra_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BC=64),
         {"A_log": "*fp32", "dt_bias": "*fp32", "g_ws": "*fp32", "stamps": "*i64", "error_flag": "*i32",
          "scale": "fp32"}, {"T", "max_seqs", "max_chunks"}),
        ("seq", S._seq_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BV=128, BC=64, ROUND_STATE=False),
         {"g_ws": "*fp32", "ssm": "*fp32", "stamps": "*i64", "error_flag": "*i32"},
         {"T", "max_ckpts", "num_slots", "block_size"})]:
        div = lambda n, ty: ty.startswith("*") or (name == "seq" and (n.startswith("s_") or n == "block_size"))
        k = compile_sm90(fn, consts, special, meta, ints, True, 4 if name == "intra" else 8, div)
        print(name, "regs, spills", ptxas_report(k), "smem", k.metadata.shared)


SHAPES = [(16, 32, 8, 2048), (8, 16, 8, 2048), (16, 32, 1, 8192)]  # (HK, HV, sequences, length)


def make_case(HK, HV, N, L):
    """N sequences of L tokens (bf16, K = V = 128, seed 0), cold starts, a state every 256 tokens
    into pool slots: the inputs, metadata, pool, workspace and output both probes launch with."""
    from gdn_graphs.ops.meta import chunk_meta, num_checkpoints
    from gdn_graphs.ops.workspace import ChunkWorkspace
    T = N * L
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(T, 2 * HK * 128 + HV * 128, device="cuda", generator=g, dtype=torch.bfloat16)
    q = qkv[:, :HK * 128].unflatten(1, (HK, 128))
    k = qkv[:, HK * 128:2 * HK * 128].unflatten(1, (HK, 128))
    v = qkv[:, 2 * HK * 128:].unflatten(1, (HV, 128))
    ab = torch.randn(T, 2 * HV, device="cuda", generator=g, dtype=torch.bfloat16)
    a, b = ab[:, :HV], ab[:, HV:]
    A_log = torch.log(torch.empty(HV, device="cuda").uniform_(1, 16, generator=g))
    dt_bias = torch.randn(HV, device="cuda", generator=g) * 0.5
    writes, ckpts, nxt = [], [], 0
    for _ in range(N):
        n = num_checkpoints(0, L, 256)
        writes.append(nxt)
        ckpts.append(list(range(nxt + 1, nxt + 1 + n)))
        nxt += 1 + n
    meta = chunk_meta([L] * N, [0] * N, [-1] * N, writes, ckpts, 256, device="cuda")
    ssm = torch.zeros(nxt, HV, 128, 128, device="cuda")
    ws = ChunkWorkspace(T, HV, 128, 128, torch.bfloat16, "cuda", HK=HK)
    out = torch.empty(T, HV, 128, device="cuda", dtype=torch.bfloat16)
    scale = 128 ** -0.5
    return T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale


def main():
    import triton
    from gdn_graphs.ops.workspace import ChunkWorkspace
    I, S = load(intra_source(), "intra_stamped"), load(seq_source(), "seq_stamped")
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = make_case(HK, HV, N, L)
        st_i = torch.zeros(meta.max_chunks * HK, INTRA_NS, dtype=torch.int64, device="cuda")
        st_s = torch.zeros(HV * meta.max_seqs, 9, dtype=torch.int64, device="cuda")
        run_i = lambda st: I.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale, stamps=st)
        run_s = lambda st: S.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, stamps=st)
        run_i0 = lambda: chunk_intra_gluon.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale)
        run_s0 = lambda: chunk_gluon.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK)
        old = load(s28_source(), "intra_s28")
        ws_old = ChunkWorkspace(T, HV, 128, 128, torch.bfloat16, "cuda", HK=HK)
        run_old = lambda: old.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws_old, meta, scale)
        run_old()
        var_runs, var_ws = {}, {}
        for vn, edits in VARIANTS.items():
            mod = load(variant_source(edits), "intra_" + vn.replace("+", "_"))
            var_ws[vn] = ChunkWorkspace(T, HV, 128, 128, torch.bfloat16, "cuda", HK=HK)
            var_runs[vn] = (lambda mod=mod, w=var_ws[vn]:
                            mod.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, w, meta, scale))
            var_runs[vn]()
        run_i0(); run_s0()
        def compare(w_a, w_b):
            res = {}
            for name in ("t", "p", "g", "qs", "kn"):
                x, y = getattr(w_a, name)[:T].double(), getattr(w_b, name)[:T].double()
                res[name] = {"equal": (x == y).double().mean().item(),
                             "rel": ((x - y).norm() / x.norm()).item(), "max_abs": (x - y).abs().max().item()}
            return res
        var_vs_lib = {vn: compare(ws, w) for vn, w in var_ws.items()}
        same_old = compare(ws_old, ws)
        ws_ref = [t.clone() for t in (ws.t, ws.p, ws.qs, ws.kn)]
        out_ref = out.clone()
        run_i(st_i); run_s(st_s); torch.cuda.synchronize()
        same = all(torch.equal(x, y) for x, y in zip(ws_ref, (ws.t, ws.p, ws.qs, ws.kn))) and torch.equal(out, out_ref)
        ms = {"intra_s28": triton.testing.do_bench(run_old), "intra": triton.testing.do_bench(run_i0),
              **{"intra_" + vn: triton.testing.do_bench(f) for vn, f in var_runs.items()}, "intra_stamped": triton.testing.do_bench(lambda: run_i(st_i)),
              "seq": triton.testing.do_bench(run_s0), "seq_stamped": triton.testing.do_bench(lambda: run_s(st_s))}
        st_i.zero_(); st_s.zero_()
        run_i(st_i); run_s(st_s); torch.cuda.synchronize()
        si = st_i.cpu()
        G = HV // HK
        full = si[(si[:, 0] > 0) & (si[:, INTRA_NS - 1] > 0)]
        d = full[:, 1:].clone() - full[:, :-1]
        pro = {"load,norm,store": d[:, 0].median().item(), "KK,QK": d[:, 1].median().item()}
        heads = {}
        for jh in range(G):
            b0 = 3 + jh * 8
            prev = full[:, b0 - 1] if jh == 0 else full[:, b0 - 1]
            cols = [full[:, b0] - prev] + [full[:, b0 + i] - full[:, b0 + i - 1] for i in range(1, 8)]
            heads[f"head{jh}"] = {name: c.median().item() for name, c in zip(INTRA_PHASES, cols)}
        # the end stamp was written after the last head's T' store: whole CTA
        whole_i = (full[:, INTRA_NS - 1] - full[:, 0]).median().item()
        def seq_phases(st):
            ss = st.cpu()
            ss = ss[ss[:, 8] > 0]
            nc = ss[:, 8].double()
            ph = {name: (ss[:, i].double() / nc).median().item() for i, name in enumerate(SEQ_PHASES)}
            return {**ph, "cta_total_per_chunk": (ss[:, 7].double() / nc).median().item(), "ctas": int(ss.shape[0])}
        seq_lib = seq_phases(st_s)
        # the sequential kernel's variants: bits (out and every pool slot) against the library's,
        # speed, phases
        out_lib, ssm_lib = out.clone(), ssm.clone()
        seq_var = {}
        for vn, edits in SEQ_VARIANTS.items():
            vsrc = seq_variant_source(edits)
            mod = load(vsrc, "seq_" + vn)
            smod = load(seq_source(vsrc), "seq_stamped_" + vn)
            out.zero_(); ssm.zero_()
            run_v = lambda mod=mod: mod.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK)
            run_v(); torch.cuda.synchronize()
            same_v = torch.equal(out, out_lib) and torch.equal(ssm, ssm_lib)
            st_s.zero_()
            smod.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, stamps=st_s); torch.cuda.synchronize()
            seq_var[vn] = {"same_bits": same_v, "ms": triton.testing.do_bench(run_v), "cycles": seq_phases(st_s)}
        run = {"shape": f"{N}x{L}", "HV": HV, "bits_unchanged_by_stamps": same, "intra_same_as_s28": same_old, "variants_vs_lib": var_vs_lib, "ms": ms,
               "intra_cycles": {"prologue": pro, **heads, "cta_total": whole_i, "ctas": int(full.shape[0])},
               "seq_cycles_per_chunk": seq_lib, "seq_variants": seq_var}
        report["runs"].append(run)
        print(json.dumps(run))
    out_dir = os.environ.get("OUT", "/tmp")
    json.dump(report, open(os.path.join(out_dir, "probe_phases.json"), "w"), indent=1)
    for r in report["runs"]:
        print(f"\n{r['shape']} HV {r['HV']}  same bits with stamps: {r['bits_unchanged_by_stamps']}  ms: " +
              ", ".join(f"{k} {v:.3f}" for k, v in r["ms"].items()))
        print("  vs s28 (equal fraction, rel): " + ", ".join(f"{k} {v['equal']:.4f} {v['rel']:.1e}"
                                                           for k, v in r["intra_same_as_s28"].items()))
        for vn, c in r["variants_vs_lib"].items():
            print(f"  {vn} vs lib (equal fraction, rel): " + ", ".join(f"{k} {v['equal']:.4f} {v['rel']:.1e}"
                                                                   for k, v in c.items()))
        ic = r["intra_cycles"]
        print("  intra (cycles, median CTA): " + ", ".join(f"{k} {v:.0f}" for k, v in ic["prologue"].items()) +
              f", total {ic['cta_total']:.0f}")
        for jh in ("head0", "head1"):
            if jh in ic:
                print(f"   {jh}: " + ", ".join(f"{k} {v:.0f}" for k, v in ic[jh].items()))
        print("  seq per chunk: " + ", ".join(f"{k} {v:.0f}" for k, v in r["seq_cycles_per_chunk"].items()))
        for vn, sv in r["seq_variants"].items():
            print(f"  seq {vn}: same bits {sv['same_bits']}, {sv['ms']:.3f} ms; per chunk: " +
                  ", ".join(f"{k} {v:.0f}" for k, v in sv["cycles"].items()))


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
