"""CPU only: does a Gluon scan on the layout Triton picks compile to the same PTX as tl.cumsum?
(twenty-sixth stop; answer: yes, instruction for instruction but for the function names).
    PYTHONPATH=. python3 profiling/results/2026-12-06/scan_ptx_cmp.py"""
import re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

@triton.jit
def t_scan(x, y, BC: tl.constexpr):
    o = tl.arange(0, BC)
    v = tl.load(x + o)
    tl.store(y + o, tl.cumsum(v, 0))

@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def g_scan(x, y, BC: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    o = gl.arange(0, BC, layout=L)
    v = gl.load(x + o)
    gl.store(y + o, gl.associative_scan(v, 0, _add))

sig = {"x": "*fp32", "y": "*fp32", "BC": "constexpr"}
attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
tk = triton.compile(ASTSource(t_scan, sig, {"BC": 64}, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
gk = triton.compile(GluonASTSource(g_scan, sig, {"BC": 64}, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
def body(ptx):
    lines = [l.strip() for l in ptx.splitlines() if re.match(r"\s*(add|shfl|mul|fma|sub|selp|setp|mov|ld|st|bar)", l)]
    return [re.sub(r"%[a-z]+\d+", "R", l) for l in lines]
print(re.findall(r"#blocked\d* = .*", tk.asm["ttgir"]))
a, b = body(tk.asm["ptx"]), body(gk.asm["ptx"])
print(len(a), len(b), a == b)
import difflib
print("\n".join(list(difflib.unified_diff(a, b, lineterm=""))[:40]))
