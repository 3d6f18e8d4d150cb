"""One-off feasibility probe (not part of the library, not a test):

    Does Gluon (triton.experimental.gluon) in Triton 3.6 compile and run a warp-specialised
    kernel on sm_90, with a 1-warp loader partition feeding a warpgroup_mma partition through
    a shared-memory ring guarded by mbarriers?

The kernel computes S[128, 128] = sum_c K_c^T @ V_c over 64-row chunks of Kt, Vt [N, 128]
(bf16, fp32 accumulator carried across chunks): the state update of a chunked linear-attention
kernel. Worker partition (1 warp): TMA-loads K_c, V_c into a 2-stage ring, signals "ready".
Default partition (4 warps = 1 warpgroup): waits "ready", wgmma(K_c^T from a permuted smem
view, V_c), waits the MMA, arrives "empty", and finally stores S.

    python probe_gluon_ws.py --compile-only   # CPU: compile for sm_90, inspect TTGIR/PTX/ptxas
    python probe_gluon_ws.py                  # GPU: compile check + correctness + timing,
                                              # JSON to $OUT/probe_gluon_ws.json (OUT default /tmp)
Exit status 0 only if every step passed.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

# Globals read inside @gluon.jit must be constexpr objects.
CHUNK = gl.constexpr(64)   # rows of Kt/Vt per chunk = the wgmma K dimension
D = gl.constexpr(128)      # head dim: S is [D, D]
STAGES = gl.constexpr(2)   # shared-memory ring depth


@gluon.jit
def _loader(k_desc, v_desc, k_bufs, v_bufs, ready, empty, n_chunks):
    # Worker partition: scalar work only (TMA issue + barrier waits), so 1 warp, few registers.
    for i in range(n_chunks):
        s = i % STAGES
        phase = (i // STAGES) & 1
        # A fresh mbarrier counts as having completed the phase before phase 0, so waiting on
        # parity phase^1 lets the first STAGES loads go through before any "empty" arrival.
        mbarrier.wait(empty.index(s), phase ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [i * CHUNK, 0], bar, k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [i * CHUNK, 0], bar, v_bufs.index(s))


@gluon.jit
def _mma(k_bufs, v_bufs, ready, empty, n_chunks, acc_layout: gl.constexpr):
    # Default partition (one warpgroup): owns the fp32 accumulator in registers.
    acc = gl.zeros([D, D], gl.float32, layout=acc_layout)
    for i in range(n_chunks):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        # K_c is stored [CHUNK, D] (D contiguous); the permuted view is K_c^T [D, CHUNK], an
        # MN-major A operand that wgmma reads straight from shared memory (legal for bf16).
        a = k_bufs.index(s).permute((1, 0))
        acc = warpgroup_mma(a, v_bufs.index(s), acc, is_async=True)
        # Wait for this MMA before releasing its stage: the loader may overwrite it right after.
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(s), count=1)
    return (acc, )  # warp_specialize flattens the default partition's results: must be a tuple


@gluon.jit
def ws_state_kernel(k_desc, v_desc, s_ptr, N):
    # wgmma layout for a [128, 128] fp32 accumulator on 4 warps: m16 x n128 x k16 (bf16).
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, D, 16])
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, CHUNK, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, CHUNK, D], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)  # completed by expect-tx + the TMA bytes
        mbarrier.init(empty.index(s), count=1)  # one arrive from the MMA partition
    n_chunks = N // CHUNK

    # First entry = default partition (kernel's num_warps, may return tensors); the rest are
    # workers with their warp counts and register budgets (setmaxnreg on Hopper).
    res = gl.warp_specialize([
        (_mma, (k_bufs, v_bufs, ready, empty, n_chunks, acc_layout)),
        (_loader, (k_desc, v_desc, k_bufs, v_bufs, ready, empty, n_chunks)),
    ], [1], [24])
    acc = res[0]

    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    rows = gl.arange(0, D, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
    gl.store(s_ptr + rows[:, None] * D + cols[None, :], acc)


def smem_layout():
    return gl.NVMMASharedLayout.get_default_for([CHUNK.value, D.value], gl.bfloat16)


# ---------------------------------------------------------------- compile-only (no GPU needed)
def compile_sm90():
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    desc_ty = f"tensordesc<bf16[{CHUNK.value}, {D.value}],{smem_layout()!r}>"
    sig = {"k_desc": desc_ty, "v_desc": desc_ty, "s_ptr": "*fp32", "N": "i32"}
    attrs = {(2, ): [["tt.divisibility", 16]]}
    src = GluonASTSource(ws_state_kernel, sig, {}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def ptxas_report(ptx):
    """Registers / spill stores per function from Triton's bundled ptxas (as tests/sm90_compile.py)."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-800:])
    return ([int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)],
            [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)])


def compile_check(report):
    ck = compile_sm90()
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    regs, spills = ptxas_report(ptx)
    info = {
        "ttgir_warp_specialize": "ttg.warp_specialize" in ttgir,
        "ttgir_warp_group_dot": "ttng.warp_group_dot" in ttgir,
        "ttgir_tma_load": "async_tma_copy_global_to_local" in ttgir,
        "ptx_wgmma_count": ptx.count("wgmma.mma_async"),
        "ptx_wgmma_shapes": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+\.\w+\.\w+\.\w+)", ptx))),
        # register hand-off between partitions (worker down to its budget, default up)
        "ptx_setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))),
        "ptx_tma_load": "cp.async.bulk.tensor" in ptx,
        "total_warps": ck.metadata.num_warps,  # default + worker warps, rounded to warpgroups
        "shared_bytes": ck.metadata.shared,
        "ptxas_registers": regs,
        "ptxas_spill_stores": spills,
    }
    ok = (info["ttgir_warp_specialize"] and info["ttgir_warp_group_dot"] and info["ptx_wgmma_count"] > 0
          and bool(spills) and not any(spills))
    report["compile"] = dict(info, ok=ok)
    for k, v in info.items():
        print(f"  {k}: {v}")
    return ok


# ---------------------------------------------------------------- GPU run
def run_gpu(report):
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 reference
    report["device"] = torch.cuda.get_device_name()
    layout, ok = smem_layout(), True
    c, d = CHUNK.value, D.value
    for N in (64, 1024, 16384):
        res = {"N": N}
        try:
            torch.manual_seed(N)
            kt = torch.randn(N, d, device="cuda", dtype=torch.bfloat16)
            vt = torch.randn(N, d, device="cuda", dtype=torch.bfloat16)
            s = torch.full((d, d), float("nan"), device="cuda", dtype=torch.float32)
            k_desc = TensorDescriptor.from_tensor(kt, [c, d], layout)
            v_desc = TensorDescriptor.from_tensor(vt, [c, d], layout)
            launch = lambda: ws_state_kernel[(1, )](k_desc, v_desc, s, N, num_warps=4)
            launch()
            torch.cuda.synchronize()
            ref = kt.float().T @ vt.float()
            err = (s - ref).abs().max().item()
            rel = ((s - ref).norm() / ref.norm()).item()
            # bf16 products are exact in fp32; only fp32 summation order differs (~1e-6).
            res.update(max_abs_err=err, rel_fro_err=rel, passed=bool(rel < 1e-3))
            ms = triton.testing.do_bench(launch)
            res.update(time_us=ms * 1e3, gbytes_per_s=2 * N * d * 2 / (ms * 1e-3) / 1e9)
            print(f"  N={N:6d}  max_abs={err:.3e}  rel_fro={rel:.3e}  {ms * 1e3:8.2f} us  "
                  f"{'PASS' if res['passed'] else 'FAIL'}")
        except Exception as e:  # one-shot GPU run: record and go on
            traceback.print_exc()
            res.update(passed=False, error=f"{type(e).__name__}: {e}")
            print(f"  N={N}: FAIL ({res['error'][:300]})")
        report["runs"].append(res)
        ok &= res["passed"]
    return ok


def main():
    compile_only = "--compile-only" in sys.argv
    report = {"triton": triton.__version__, "runs": []}
    ok = True
    print(f"triton {triton.__version__}: compile for sm_90")
    try:
        ok &= compile_check(report)
    except Exception as e:
        traceback.print_exc()
        report["compile"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        ok = False
    if not compile_only:
        print("GPU run")
        try:
            ok &= run_gpu(report)
        except Exception as e:
            traceback.print_exc()
            report["gpu_error"] = f"{type(e).__name__}: {e}"
            ok = False
        path = os.path.join(os.environ.get("OUT", "/tmp"), "probe_gluon_ws.json")
        try:
            with open(path, "w") as f:
                json.dump(dict(report, ok=ok), f, indent=1)
            print(f"wrote {path}")
        except Exception:
            traceback.print_exc()
            ok = False
    print("PROBE", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
