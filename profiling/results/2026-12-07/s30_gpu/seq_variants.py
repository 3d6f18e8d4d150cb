"""GPU probe (thirtieth stop): occupancy and prefetch depth of the Gluon sequential kernel.

The kernel runs one CTA an SM at both V tiles (bv 128: 128 KB of ring + 16 KB output tile, 236
registers a thread on 8 warps; bv 64: 112 + 8 KB). Its chain waits on memory it cannot overlap:
a second CTA an SM, or a deeper ring, could. Variants generated from the library's source (s29's
probe_phases.edited), each timed beside the library kernel and its outputs and every pool slot
compared with the library's (the arithmetic is not touched: the same bits expected):

    alias      the output tile transposed through the chunk's own v tile (each warp rewrites the
               entries of v it has read) instead of its own buffer: bv 64 needs 112 KB, so two
               CTAs an SM (2 x 128 threads x 241 registers fit the register file)
    ring3      a three-stage ring (chunk j + 2's copies issued while chunk j runs); bv 128 only
               (208 KB)
    slot       a block boundary's checkpoint slot loaded before the chunk's chain, not after it
               (its global load's latency was on the chain, every fourth chunk at block 256)
    cstate     the states stored from a layout of 16-byte runs along a row (converted through
               shared memory) instead of the wgmma layout's 8-byte pairs
    and combinations (+)

For each shape (probe_phases.SHAPES, bf16, a state every 256 tokens), median ms (do_bench).

    PYTHONPATH=. python3 profiling/results/2026-12-07/s30_gpu/seq_variants.py [--compile]

Ran in call 2 against 110358c's library. The alias is main's since f22d5d7, so these edits no
longer apply there: rerun with 110358c's gdn_graphs on the path.
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

ALIAS = [
    ("        o_s = gl.allocate_shared_memory(DT, [BC, BV], SHV)\n", ""),
    ("            o_s.permute((1, 0)).store(oT.to(DT))\n", "            v_s.index(st).permute((1, 0)).store(oT.to(DT))\n"),
    ("            o = o_s.load(LDV)\n", "            o = v_s.index(st).load(LDV)\n"),
]
RING3 = [(f"        {n}_s = gl.allocate_shared_memory(DT, [2, ", f"        {n}_s = gl.allocate_shared_memory(DT, [3, ")
         for n in "qkvtp"] + [
    ("nothing read).\"\"\"\n        st = j % 2\n", "nothing read).\"\"\"\n        st = j % 3\n"),
    ("            st = j % 2\n", "            st = j % 3\n"),
    ("""        for j in range(nc):
            st = j % 3""", """        _issue_chunk(1, q_s, k_s, v_s, t_s, p_s, qs_ws, kn_ws, v, t_ws, p_ws, bos, eos, off, nc, i_h, i_hk,
                     i_v, s_vt, HK, HV, K, V, BV, BC, LD128, LD64, LDV)
        for j in range(nc):
            st = j % 3"""),
    ("            _issue_chunk(j + 1, q_s", "            _issue_chunk(j + 2, q_s"),
    ("            async_copy.wait_group(1)", "            async_copy.wait_group(2)"),
]
SLOT_EARLY = [  # the checkpoint slot's global load issued before the chain, not after it
    ("""            eg = gl.exp(gc)
""", """            eg = gl.exp(gc)
            p_end = (c0 + j + 1) * BC  # absolute end of this chunk when it is full
            at_block = (p_end % block_size) == 0
            i_e = ck0 + (p_end // block_size - first_blk - 1)
            slot = gl.load(ckpt_slots + i_e, mask=at_block & (p_end < n_end) & (i_e < max_ckpts), other=-1)
"""),
    ("""            p_end = (c0 + j + 1) * BC  # absolute end of this chunk when it is full
            at_block = (p_end % block_size) == 0
            if ROUND_STATE:""", """            if ROUND_STATE:"""),
    ("""                i_e = ck0 + (p_end // block_size - first_blk - 1)
                slot = gl.load(ckpt_slots + i_e, mask=i_e < max_ckpts, other=-1)
""", ""),
]
CSTATE = [  # states stored from a layout of 16-byte row runs (converted through shared memory)
    ("""        p_state = i_h * (V * K) + rv[:, None] * K + ck[None, :]
""", """        p_state = i_h * (V * K) + rv[:, None] * K + ck[None, :]
        LST: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])
        rvs = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, LST))
        cks = gl.arange(0, K, layout=gl.SliceLayout(0, LST))
        p_st = i_h * (V * K) + rvs[:, None] * K + cks[None, :]
"""),
    ("gl.store(ssm + slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))",
     "gl.store(ssm + slot.to(gl.int64) * s_slot + p_st, gl.convert_layout(S.to(ssm.dtype.element_ty), LST))"),
    ("gl.store(ssm + w_slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))",
     "gl.store(ssm + w_slot.to(gl.int64) * s_slot + p_st, gl.convert_layout(S.to(ssm.dtype.element_ty), LST))"),
]
VARIANTS = {"alias": ALIAS, "ring3": RING3, "ring3+alias": RING3 + ALIAS, "slot": SLOT_EARLY, "cstate": CSTATE,
            "slot+cstate": SLOT_EARLY + CSTATE, "alias+slot": ALIAS + SLOT_EARLY,
            "alias+slot+cstate": ALIAS + SLOT_EARLY + CSTATE}
RUNS = [("lib", 128), ("lib", 64), ("alias", 128), ("alias", 64), ("ring3", 128), ("ring3+alias", 128),
        ("slot", 128), ("cstate", 128), ("slot+cstate", 128), ("alias+slot", 64), ("alias+slot", 128),
        ("alias+slot+cstate", 128)]


def modules():
    from gdn_graphs.ops import chunk_gluon
    mods = {"lib": chunk_gluon}
    for n, e in VARIANTS.items():
        mods[n] = P.load(P.edited(chunk_gluon, e), "seq_" + n.replace("+", "_"))
    return mods


def compile_only():
    sys.path.insert(0, "tests")
    from sm90_compile import compile_sm90, ptxas_report
    meta = {"cu_seqlens", "start_pos", "read_slot", "write_slot", "ckpt_offsets", "ckpt_slots"}
    div = lambda n, ty: ty.startswith("*") or n.startswith("s_") or n == "block_size"
    mods = modules()
    for n, bv in RUNS:
        k = compile_sm90(mods[n]._seq_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BV=bv, BC=64,
                                                         ROUND_STATE=False), {"g_ws": "*fp32", "ssm": "*fp32"},
                         meta, {"T", "max_ckpts", "num_slots", "block_size"}, False, bv // 16, div)
        print(n, bv, "regs, spills", ptxas_report(k), "smem", k.metadata.shared)


def main():
    from gdn_graphs.ops import chunk_intra_gluon
    mods = modules()
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in P.SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        chunk_intra_gluon.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale)
        seq = lambda n, bv: (lambda: mods[n].chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=bv))
        ssm.zero_()
        seq("lib", 128)()
        out_ref, ssm_ref = out.clone(), ssm.clone()
        ms, same = {}, {}
        for n, bv in RUNS:
            out.zero_(); ssm.zero_()
            seq(n, bv)()
            same[f"{n} {bv}"] = torch.equal(out, out_ref) and torch.equal(ssm, ssm_ref)
        for n, bv in RUNS:
            ms[f"{n} {bv}"] = triton.testing.do_bench(seq(n, bv))
        run = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "same_bits": same}
        report["runs"].append(run)
        print(f"{N}x{L} HV {HV}: " + ", ".join(f"{k} {v:.4f}{'' if same[k] else ' DIFF'}" for k, v in ms.items()))
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "seq_variants.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
