"""CPU only: does a Gluon scan on the layout Triton picks compile to the same PTX as tl.cumsum?
(twenty-sixth stop; answer: yes, instruction for instruction but for the function names). And for a
row sum on the layout Triton picks: the same float instructions and shuffles, scheduled in another
order (whether each row's summation tree is the same needs a dataflow comparison or a GPU).
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
    # register numbers and the kernel's name (its parameters are named after it) aside
    return [re.sub(r"[tg]_scan_param", "scan_param", re.sub(r"%[a-z]+\d+", "R", l)) for l in lines]
print(re.findall(r"#blocked\d* = .*", tk.asm["ttgir"]))
a, b = body(tk.asm["ptx"]), body(gk.asm["ptx"])
print(len(a), len(b), a == b)
import difflib
print("\n".join(list(difflib.unified_diff(a, b, lineterm=""))[:40]))


# the same question for a row reduction: the l2 norm's sum of squares over a [64, 128] tile
@triton.jit
def t_rsum(x, y, BC: tl.constexpr, K: tl.constexpr):
    r = tl.arange(0, BC)
    c = tl.arange(0, K)
    v = tl.load(x + r[:, None] * K + c[None, :])
    tl.store(y + r, tl.sum(v * v, 1))


@gluon.jit
def g_rsum(x, y, BC: gl.constexpr, K: gl.constexpr):
    # the layout Triton picked for t_rsum (its TTGIR, printed below)
    L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    r = gl.arange(0, BC, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, K, layout=gl.SliceLayout(0, L))
    v = gl.load(x + r[:, None] * K + c[None, :])
    gl.store(y + r, gl.sum(v * v, 1))


sig2 = dict(sig, K="constexpr")
tk = triton.compile(ASTSource(t_rsum, sig2, {"BC": 64, "K": 128}, attrs), target=GPUTarget("cuda", 90, 32),
                    options=dict(num_warps=4))
gk = triton.compile(GluonASTSource(g_rsum, sig2, {"BC": 64, "K": 128}, attrs), target=GPUTarget("cuda", 90, 32),
                    options=dict(num_warps=4))
print(re.findall(r"#blocked\d* = .*", tk.asm["ttgir"]))
strip = lambda p: [re.sub(r"[tg]_rsum_param", "rsum_param", x) for x in body(p)]  # noqa: E731
a, b = strip(tk.asm["ptx"]), strip(gk.asm["ptx"])
print("row sum, whole listing equal:", len(a), len(b), a == b)
# the float arithmetic and shuffles alone: the same instructions, in another schedule
arith = lambda xs: [x for x in xs if (re.match(r"(add|mul|fma|sub)\.", x) and ".f32" in x)  # noqa: E731
                    or x.startswith("shfl")]
print("row sum, float ops and shuffles: same sequence", arith(a) == arith(b), "| same multiset",
      sorted(arith(a)) == sorted(arith(b)), len(arith(a)))
