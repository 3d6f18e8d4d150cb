"""Every Triton kernel of the project reads module globals only in forms a compiled kernel accepts.

The CPU tier runs kernels under the Triton interpreter, which reads any Python global. A compiled
kernel reads a global only when it is a ``tl.constexpr``, another jitted function, a module or a
Triton builtin; anything else (a plain int such as ``NO_SLOT``) fails when the kernel is first
compiled on a GPU. That happened once (``spec_placement``: a NameError at vLLM's warm-up on an
H200 after a green CPU tier), so this check reads each kernel's source and looks up every global
name it loads.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import sys
import textwrap
import types

import pytest
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

# what @triton.jit returns with and without TRITON_INTERPRET (the CPU tier sets it)
_JIT = (JITFunction, InterpretedFunction)

import gdn_graphs

# Python builtins a Triton kernel may call (the code generator handles these itself)
_BUILTINS = {"range", "min", "max", "len", "int", "float", "bool", "isinstance", "print",
             "tuple", "getattr", "hasattr", "zip", "enumerate", "abs"}


def _unwrap(obj):
    """The jitted function under ``triton.heuristics`` / ``triton.autotune`` wrappers, else
    None."""
    for _ in range(4):
        if isinstance(obj, _JIT):
            return obj
        obj = getattr(obj, "fn", None)
    return None


# vLLM's version adapters: they import vLLM, define no kernel, and importing vLLM at collection,
# before the vLLM tier's vllm_cpu fixture picks its platform, leaves vLLM on an unspecified
# platform for every later test (seen in the fresh-clone CI)
_SKIP = ("gdn_graphs.vllm.v0_",)


def _kernels():
    """(module, name, jitted function) for every kernel defined in gdn_graphs (modules that fail
    to import where an optional dependency is missing are skipped)."""
    found = []
    for info in pkgutil.walk_packages(gdn_graphs.__path__, "gdn_graphs."):
        if info.name.startswith(_SKIP):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        for name, obj in vars(mod).items():
            fn = _unwrap(obj)
            if fn is not None and fn.fn.__module__ == mod.__name__:
                found.append((mod.__name__, name, fn))
    return found


def _loaded_globals(fn) -> set[str]:
    """Names the kernel's body loads that are not its arguments or locals."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    func = tree.body[0]
    local = {a.arg for a in func.args.args + func.args.kwonlyargs}
    loads = set()
    body = ast.Module(body=func.body, type_ignores=[])  # not the decorators' lambdas
    for node in ast.walk(body):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                local.add(node.id)
            else:
                loads.add(node.id)
    return loads - local


def _compiled_kernel_accepts(value) -> bool:
    if isinstance(value, (tl.constexpr, types.ModuleType)) or _unwrap(value):
        return True
    module = getattr(value, "__module__", "") or ""
    return module.startswith("triton") or getattr(value, "__triton_builtin__", False)


_VLLM_BEFORE = "vllm" in sys.modules
KERNELS = _kernels()


def test_collecting_imports_no_vllm():
    """Collecting this file must not import vLLM (see _SKIP)."""
    assert _VLLM_BEFORE or "vllm" not in sys.modules


def test_kernels_are_found():
    names = {name for _, name, _ in KERNELS}
    # one from each kernel module of gdn_graphs.ops and the vLLM adapter's placement kernel
    for expected in ("_conv_prefill_kernel", "_gdn_decode_kernel", "_fi_prep_kernel",
                     "_place_spec_rows_kernel"):
        assert expected in names, sorted(names)


@pytest.mark.parametrize("module, name, fn", KERNELS, ids=[f"{m}.{n}" for m, n, _ in KERNELS])
def test_kernel_reads_only_constexpr_globals(module, name, fn):
    bad = []
    for g in sorted(_loaded_globals(fn)):
        if g in fn.fn.__globals__:
            if not _compiled_kernel_accepts(fn.fn.__globals__[g]):
                bad.append(f"{g} = {fn.fn.__globals__[g]!r}")
        elif not (hasattr(builtins, g) and g in _BUILTINS):
            bad.append(f"{g} (undefined or an unsupported builtin)")
    assert not bad, (f"{module}.{name} reads globals a compiled kernel rejects: {bad}; wrap "
                     f"constants in tl.constexpr (see gdn_graphs.ops.common)")
