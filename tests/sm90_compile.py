"""Compile a Triton kernel for an H200 (sm_90) without a GPU and read ptxas's register report:
what the sm90 compile tests of test_chunk and test_fi_core share. Their scripts run in a
subprocess without the Triton interpreter (``run_script``) and import this module."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile


def ptxas_path() -> str:
    """Triton's bundled ptxas (absent from some Triton builds: the tests skip then)."""
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_sm90(fn, consts: dict, special: dict, meta: set, ints, has_flag: bool, num_warps: int,
                 divisible=lambda name, ty: ty.startswith("*"), default: str = "*bf16", **extra):
    """Compile ``fn`` (a Triton or Gluon JITFunction) for sm_90. consts: constexpr values
    (HAS_FLAG added where fn has one; a missing error flag becomes a None constexpr); special:
    argument -> Triton type; meta: int32 metadata pointers; ints / names starting "s_": i32
    scalars; every other argument of type ``default`` (a bf16 pointer). divisible(name, type):
    arguments the GPU launcher specialises on 16-divisibility."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    source = ASTSource  # the class that builds the IR: Gluon's for a Gluon kernel
    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
        if isinstance(fn, GluonJITFunction):
            source = GluonASTSource
    except ImportError:
        pass

    consts = dict(consts, **({"HAS_FLAG": has_flag} if "HAS_FLAG" in fn.arg_names else {}))
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name == "error_flag" and not has_flag:
            sig[name] = "constexpr"
            consts[name] = None
        elif name in special:
            sig[name] = special[name]
        elif name in meta:
            sig[name] = "*i32"
        elif fn.params[i].is_constexpr:
            continue
        elif name in ints or name.startswith("s_"):
            sig[name] = "i32"
        else:
            sig[name] = default
        if divisible(name, sig[name]):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(source(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, **extra))


def ptxas_report(ck) -> tuple[list[str], list[int]]:
    """(registers, spill stores) per function that ptxas reports for the compiled kernel."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ck.asm["ptx"])
    try:
        res = subprocess.run([ptxas_path(), "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert res.returncode == 0 and spills, res.stderr[-800:]
    return re.findall(r"Used (\d+) registers", res.stderr), spills


def run_script(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a compile script in a fresh interpreter without TRITON_INTERPRET, with the project and
    this folder on its path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)
