"""gdn_decode / gdn_decode_multi against reference.gdn_recurrent_ref (float64).

Tolerances are relative, ||x - ref|| / ||ref|| per row (or per stored state):
    outputs: 1e-5 with fp32 inputs, 2e-2 with bf16 inputs (the output itself is rounded to bf16)
    stored states: 1e-5 in an fp32 pool, 1e-2 in a bf16 pool (one rounding to bf16 per store)
Every pool test checks the outputs of real rows, every slot written, and that every other slot
(plus a guard slot on each side of the pool, standing in for "slot -1" and "slot num_slots") is
bit-identical to before.
"""

import random

import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.decode import default_config, gdn_decode, gdn_decode_multi
from gdn_graphs.ops.reference import gdn_recurrent_ref
from helpers import bits, guarded_pool, rel

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test extra
    given = None

OUT_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-5}
STATE_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
HK, HV = 2, 4


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def make_pool(num_slots, hv, v, k, dtype, device, pad=0, seed=0):
    """A random pool between two NaN guard slots (helpers.guarded_pool): (buffer, pool)."""
    return guarded_pool(num_slots, (hv, v, k), dtype, device, pad=pad, seed=seed)


def make_inputs(T, K, V, dtype, device, packed=False, seed=0, hk=HK, hv=HV):
    """Token inputs; with ``packed`` q, k, v are strided views of one [T, 2*HK*K + HV*V] tensor
    (plus a trailing column) and a, b views of one [T, 2*HV + 1] tensor."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(device)  # noqa: E731
    if packed:
        qkv = rnd(T, 2 * hk * K + hv * V + 3)
        q = qkv[:, :hk * K].unflatten(1, (hk, K))
        k = qkv[:, hk * K:2 * hk * K].unflatten(1, (hk, K))
        v = qkv[:, 2 * hk * K:2 * hk * K + hv * V].unflatten(1, (hv, V))
        ab = rnd(T, 2 * hv + 1)
        a, b = ab[:, :hv], ab[:, hv:2 * hv]
    else:
        q, k, v = rnd(T, hk, K), rnd(T, hk, K), rnd(T, hv, V)
        a, b = rnd(T, hv), rnd(T, hv)
    A_log = (torch.rand(hv, generator=gen) * 2 - 1).float().to(device)
    dt_bias = torch.randn(hv, generator=gen).float().to(device)
    return q, k, v, a, b, A_log, dt_bias


KINDS = ("move", "inplace", "fresh", "drop", "pad")


def slot_layout(kinds, num_slots, rng):
    """Slots for rows of the given kinds, following the planner's rules: write slots are distinct
    and never read by another row; read-only slots may be shared (a cached prefix block).
        move: read r, write w != r   inplace: read = write   fresh: read -1, write w
        drop: read r, write -1       pad: both -1"""
    perm = rng.sample(range(num_slots), num_slots)
    shared, free = perm[:3], perm[3:]
    reads, writes = [], []
    for kind in kinds:
        if kind == "move":
            reads.append(rng.choice(shared)), writes.append(free.pop())
        elif kind == "inplace":
            s = free.pop()
            reads.append(s), writes.append(s)
        elif kind == "fresh":
            reads.append(NO_SLOT), writes.append(free.pop())
        elif kind == "drop":
            reads.append(rng.choice(shared)), writes.append(NO_SLOT)
        else:
            reads.append(NO_SLOT), writes.append(NO_SLOT)
    return reads, writes


def check_decode(q, k, v, a, b, A_log, dt_bias, buf, pool, reads, writes, out, in_dtype, **kw):
    """Run gdn_decode on a copy of the pool state and check outputs, written slots, the rest."""
    N = q.shape[0]
    dev = q.device
    buf0 = buf.clone()
    pool0 = buf0[1:-1, :pool[0].numel()].unflatten(1, pool.shape[1:])
    # slot tensors longer than N, tail poisoned: the kernel must only look at the first N
    rs = torch.tensor(list(reads) + [5, 5], dtype=torch.int32, device=dev)
    ws = torch.tensor(list(writes) + [6, 6], dtype=torch.int32, device=dev)
    res = gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, rs, ws, out=out, **kw)
    if out is not None:
        assert res is out
    assert res.shape == (N, v.shape[1], v.shape[2]) and res.dtype == v.dtype
    assert not torch.isnan(res).any(), "an output element was never written"
    written = set()
    for i in range(N):
        r, w = reads[i], writes[i]
        if r == NO_SLOT and w == NO_SLOT:
            assert torch.equal(res[i], torch.zeros_like(res[i])), f"padded row {i} not zero"
            continue
        init = None if r == NO_SLOT else pool0[r]
        o_ref, s_ref = gdn_recurrent_ref(q[i:i + 1], k[i:i + 1], v[i:i + 1], a[i:i + 1],
                                         b[i:i + 1], A_log, dt_bias, init, scale=kw.get("scale"))
        assert rel(res[i], o_ref[0]) < OUT_TOL[in_dtype], f"row {i} output"
        if w != NO_SLOT:
            assert rel(pool[w], s_ref) < STATE_TOL[pool.dtype], f"row {i} state in slot {w}"
            written.add(w)
    for s in range(pool.shape[0]):
        if s not in written:
            assert torch.equal(bits(pool[s]), bits(pool0[s])), f"slot {s} changed"
    assert torch.equal(bits(buf[0]), bits(buf0[0])), "guard memory before the pool changed"
    assert torch.equal(bits(buf[-1]), bits(buf0[-1])), "guard memory after the pool changed"
    return res


# ---------------------------------------------------------------------------------------------
# gdn_decode (one token per row)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N", [1, 3, 7])
@pytest.mark.parametrize("KV", [16, 32])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference(N, KV, state_dtype, device):
    in_dtype = torch.float32 if state_dtype == torch.float32 else torch.bfloat16
    rng = random.Random(N * 100 + KV)
    # cycle through every kind of row; N = 1 takes a different kind for each shape
    start = (KV // 16 + (state_dtype == torch.bfloat16)) % len(KINDS) if N == 1 else 0
    kinds = [KINDS[(start + i) % len(KINDS)] for i in range(N)]
    buf, pool = make_pool(16, HV, KV, KV, state_dtype, device, seed=N)
    inputs = make_inputs(N, KV, KV, in_dtype, device, seed=N + KV)
    reads, writes = slot_layout(kinds, 16, rng)
    check_decode(*inputs, buf, pool, reads, writes, None, in_dtype)


def test_decode_packed_views_padded_pool_and_out(device):
    """q/k/v/a/b as strided views of packed tensors, slot stride > state size, a strided out."""
    N, K, V = 5, 32, 16
    buf, pool = make_pool(16, HV, V, K, torch.float32, device, pad=40)
    assert pool.stride(0) == HV * V * K + 40
    inputs = make_inputs(N, K, V, torch.float32, device, packed=True, seed=3)
    assert inputs[0].stride(0) != HK * K and inputs[3].stride(0) != HV
    out_big = torch.empty(N, HV * V + 8, device=device)
    out = out_big[:, :HV * V].unflatten(1, (HV, V))
    reads, writes = slot_layout(["move", "pad", "inplace", "fresh", "drop"], 16, random.Random(1))
    check_decode(*inputs, buf, pool, reads, writes, out, torch.float32, scale=0.3)
    assert torch.isnan(out_big[:, HV * V:]).all(), "out's padding columns were written"


def test_padded_rows_ignore_garbage_inputs(device):
    """A padded row does no math: NaN inputs still give exactly zero and touch no slot."""
    N, K = 4, 16
    buf, pool = make_pool(8, HV, K, K, torch.float32, device)
    q, k, v, a, b, A_log, dt_bias = make_inputs(N, K, K, torch.float32, device)
    for t in (q, k, v, a, b):
        t[1] = float("nan")
        t[3] = float("nan")
    reads, writes = [2, NO_SLOT, 5, NO_SLOT], [3, NO_SLOT, 5, NO_SLOT]
    res = check_decode(q, k, v, a, b, A_log, dt_bias, buf, pool, reads, writes, None,
                       torch.float32)
    assert torch.equal(bits(res[1]), bits(torch.zeros_like(res[1])))  # +0.0, not -0.0


@pytest.mark.parametrize("BV,num_warps", [(1, 1), (4, 1), (8, 2), (32, 4), (64, 4)])
def test_decode_tile_overrides(BV, num_warps, device):
    """Every tile height gives the reference answer, including BV > V and BV = 1."""
    N, K = 3, 32
    buf, pool = make_pool(8, HV, K, K, torch.float32, device)
    inputs = make_inputs(N, K, K, torch.float32, device, seed=BV)
    reads, writes = slot_layout(["move", "inplace", "fresh"], 8, random.Random(BV))
    check_decode(*inputs, buf, pool, reads, writes, None, torch.float32,
                 BV=BV, num_warps=num_warps)


@pytest.mark.parametrize("nsub,BV,V", [(2, 4, 16), (4, 4, 16), (2, 8, 20), (8, 4, 16)])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_decode_subtiles_equal_one_tile_bitwise(nsub, BV, V, state_dtype, device):
    """nsub tiles per program (the successor's load before the math, q/k/gates once): the
    reference answer and exactly the bits of one tile per program, incl. a partial last tile
    (V = 20), tiles past V (nsub * BV > V), padded and in-place rows, guards untouched."""
    N, K = 5, 16
    in_dtype = torch.float32 if state_dtype == torch.float32 else torch.bfloat16
    inputs = make_inputs(N, K, V, in_dtype, device, seed=nsub * 10 + BV)
    buf, pool = make_pool(12, HV, V, K, state_dtype, device, seed=nsub)
    reads, writes = slot_layout(["move", "pad", "inplace", "fresh", "drop"], 12,
                                random.Random(nsub + BV))
    pool1 = pool.clone()
    res = check_decode(*inputs, buf, pool, reads, writes, None, in_dtype, BV=BV, num_warps=1,
                       nsub=nsub)
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    one = gdn_decode(*inputs, pool1, t(reads), t(writes), BV=BV, num_warps=1)
    assert torch.equal(bits(res), bits(one)) and torch.equal(bits(pool), bits(pool1))


def test_decode_nsub_must_be_a_power_of_two(device):
    N, K = 2, 16
    inputs = make_inputs(N, K, K, torch.float32, device)
    _, pool = make_pool(4, HV, K, K, torch.float32, device)
    rs = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="nsub must be a power of two"):
        gdn_decode(*inputs, pool, rs, rs, nsub=3)


def test_decode_non_power_of_two_dims(device):
    """K = 24, V = 20: masked lanes along K and a partial last V tile; HK = HV (no grouping)."""
    N, K, V, hk, hv = 3, 24, 20, 3, 3
    buf, pool = make_pool(8, hv, V, K, torch.float32, device)
    inputs = make_inputs(N, K, V, torch.float32, device, seed=7, hk=hk, hv=hv)
    reads, writes = slot_layout(["move", "fresh", "inplace"], 8, random.Random(7))
    check_decode(*inputs, buf, pool, reads, writes, None, torch.float32, BV=8)


def test_inplace_equals_out_of_place_bitwise(device):
    """Reading and writing the same slot or different slots is the same arithmetic."""
    N, K = 2, 32
    inputs = make_inputs(N, K, K, torch.float32, device, seed=11)
    _, pool = make_pool(8, HV, K, K, torch.float32, device, seed=11)
    p1, p2 = pool.clone(), pool.clone()
    rs = torch.tensor([1, 4], dtype=torch.int32, device=device)
    o1 = gdn_decode(*inputs, p1, rs, rs)
    o2 = gdn_decode(*inputs, p2, rs, torch.tensor([6, 7], dtype=torch.int32, device=device))
    assert torch.equal(o1, o2)
    assert torch.equal(p1[1], p2[6]) and torch.equal(p1[4], p2[7])


def test_decode_fp64_inputs(device):
    """fp64 inputs are accepted (math still in fp32; output in fp64)."""
    N, K = 2, 16
    buf, pool = make_pool(6, HV, K, K, torch.float32, device)
    inputs = make_inputs(N, K, K, torch.float64, device, seed=5)
    reads, writes = slot_layout(["move", "fresh"], 6, random.Random(5))
    check_decode(*inputs, buf, pool, reads, writes, None, torch.float64)


def test_decode_empty_batch(device):
    """N = 0 launches nothing and returns an empty output."""
    inputs = make_inputs(0, 16, 16, torch.float32, device)
    _, pool = make_pool(4, HV, 16, 16, torch.float32, device)
    before = pool.clone()
    slots = torch.zeros(0, dtype=torch.int32, device=device)
    out = gdn_decode(*inputs, pool, slots, slots)
    assert out.shape == (0, HV, 16) and torch.equal(pool, before)


def test_default_config():
    # the measured optimum on an H200 at Qwen3-Next shapes (see default_config's docstring)
    assert default_config(128, 128, 64) == (8, 1, 1)
    assert default_config(128, 128, 256) == (8, 1, 1)
    assert default_config(128, 128, 1) == (4, 1, 1)
    # a bf16 pool: the same [8, 128] tile, two per program (~4 KiB in flight per program)
    assert default_config(128, 128, 256, torch.bfloat16) == (8, 1, 2)
    assert default_config(128, 128, 4, torch.bfloat16) == (4, 1, 1)
    assert default_config(16, 16, 3)[0] <= 16
    assert default_config(16, 16, 64, torch.bfloat16)[2] == 1  # one tile covers V


if given is not None:
    @settings(deadline=None, max_examples=8, derandomize=True)
    @given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
           seed=st.integers(0, 2 ** 16), bf16_state=st.booleans())
    def test_decode_random_slot_layouts(kinds, seed, bf16_state):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        state_dtype = torch.bfloat16 if bf16_state else torch.float32
        buf, pool = make_pool(12, HV, 16, 16, state_dtype, device, seed=seed)
        inputs = make_inputs(len(kinds), 16, 16, torch.float32, device, seed=seed)
        reads, writes = slot_layout(kinds, 12, random.Random(seed))
        check_decode(*inputs, buf, pool, reads, writes, None, torch.float32)


# ---------------------------------------------------------------------------------------------
# gdn_decode_multi (a few tokens per row)
# ---------------------------------------------------------------------------------------------

def check_multi(lens, reads, write_slots, K, V, in_dtype, state_dtype, device, num_slots=16,
                seed=0, **kw):
    N = len(lens)
    T = sum(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    q, k, v, a, b, A_log, dt_bias = make_inputs(T, K, V, in_dtype, device, seed=seed)
    buf, pool = make_pool(num_slots, HV, V, K, state_dtype, device, seed=seed)
    buf0 = buf.clone()
    pool0 = buf0[1:-1, :pool[0].numel()].unflatten(1, pool.shape[1:])
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    rs = torch.tensor(reads, dtype=torch.int32, device=device)
    ws = torch.tensor(write_slots, dtype=torch.int32, device=device)
    out = gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, pool, cu_t, rs, ws, **kw)
    assert out.shape == (T, HV, V) and out.dtype == v.dtype
    assert not torch.isnan(out).any(), "an output element was never written"
    written = set()
    for i in range(N):
        s, e = cu[i], cu[i + 1]
        if s == e:
            continue
        init = None if reads[i] == NO_SLOT else pool0[reads[i]]
        o_ref, _, states = gdn_recurrent_ref(q[s:e], k[s:e], v[s:e], a[s:e], b[s:e], A_log,
                                             dt_bias, init, return_all_states=True)
        assert rel(out[s:e], o_ref) < OUT_TOL[in_dtype], f"row {i} outputs"
        for t in range(e - s):
            w = write_slots[i][t] if t < len(write_slots[i]) else NO_SLOT
            if w != NO_SLOT:
                # the state is rounded to the pool's dtype after every token (as token-by-token
                # gdn_decode does), so a 16-bit state's error grows with the tokens behind it;
                # an fp32 state is not rounded and keeps the fixed tolerance
                grow = 1 if state_dtype == torch.float32 else 1 + t
                tol = STATE_TOL[state_dtype] * grow
                assert rel(pool[w], states[t]) < tol, f"row {i} token {t}"
                written.add(w)
    for s in range(num_slots):
        if s not in written:
            assert torch.equal(bits(pool[s]), bits(pool0[s])), f"slot {s} changed"
    assert torch.equal(bits(buf[0]), bits(buf0[0])) and torch.equal(bits(buf[-1]), bits(buf0[-1]))
    return out


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_multi_matches_reference(state_dtype, device):
    in_dtype = torch.float32 if state_dtype == torch.float32 else torch.bfloat16
    _ = NO_SLOT
    lens = [3, 0, 5, 1, 4, 2]
    reads = [1, 2, 4, _, 1, 9]
    write_slots = [
        [3, _, 5, _, _],        # moves, snapshot after tokens 1 and 3
        [6, 6, 6, 6, 6],        # 0-token row: padding, must write nothing even with live slots
        [_, _, _, _, 4],        # in place: final state back to its read slot
        [7, _, _, _, _],        # starts from zeros
        [8, 10, 11, 12, _],     # a state after every token (speculative decoding)
        [_, _],                 # reads 9, stores nothing; row narrower than Tmax is fine
    ]
    width = 5
    write_slots = [row + [_] * (width - len(row)) for row in write_slots]
    check_multi(lens, reads, write_slots, 32, 32, in_dtype, state_dtype, device, seed=1)


def test_multi_single_token_rows_equal_decode(device):
    """With one token per row the varlen path gives the same bits as gdn_decode."""
    N, K = 3, 16
    inputs = make_inputs(N, K, K, torch.float32, device, seed=2)
    _, pool = make_pool(8, HV, K, K, torch.float32, device, seed=2)
    p1, p2 = pool.clone(), pool.clone()
    rs = torch.tensor([0, -1, 3], dtype=torch.int32, device=device)
    ws = torch.tensor([4, 5, 3], dtype=torch.int32, device=device)
    o1 = gdn_decode(*inputs, p1, rs, ws)
    cu = torch.arange(N + 1, dtype=torch.int32, device=device)
    o2 = gdn_decode_multi(*inputs, p2, cu, rs, ws[:, None].contiguous())
    assert torch.equal(o1, o2) and torch.equal(p1, p2)


def test_multi_tokens_past_width_store_nothing(device):
    """write_slots narrower than a row: tokens beyond its width are computed but not stored.
    Row 0 has 4 tokens and 2 entries; reading past them would find row 1's (live) slots 6 and 7,
    which row 1 (0 tokens) must not write either."""
    _ = NO_SLOT
    check_multi([4, 0], [0, _], [[_, 2], [6, 7]], 16, 16, torch.float32, torch.float32, device,
                num_slots=8, seed=4)


def test_multi_all_rows_empty(device):
    """A batch that is all padding launches fine and touches nothing."""
    _ = NO_SLOT
    check_multi([0, 0, 0], [1, 2, _], [[3], [4], [5]], 16, 16, torch.float32, torch.float32,
                device, num_slots=8)


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------

def _good(device, N=2, K=16):
    q, k, v, a, b, A_log, dt_bias = make_inputs(N, K, K, torch.float32, device)
    _, pool = make_pool(4, HV, K, K, torch.float32, device)
    rs = torch.zeros(N, dtype=torch.int32, device=device)
    ws = torch.ones(N, dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=pool,
                read_slot=rs, write_slot=ws)


BAD = {
    "q int dtype": lambda d: {"q": d["q"].to(torch.int32)},
    "q/k dtype mismatch": lambda d: {"k": d["k"].bfloat16()},
    "q/k shape mismatch": lambda d: {"k": d["k"][:, :1]},
    "v token count": lambda d: {"v": d["v"][:1]},
    "HV not multiple of HK": lambda d: {"v": d["v"][:, :3], "a": d["a"][:, :3],
                                        "b": d["b"][:, :3], "A_log": d["A_log"][:3],
                                        "dt_bias": d["dt_bias"][:3], "ssm": d["ssm"][:, :3]},
    "q last dim strided": lambda d: {"q": d["q"].transpose(1, 2).contiguous().transpose(1, 2)},
    "a wrong shape": lambda d: {"a": d["a"][:, :2]},
    "A_log int": lambda d: {"A_log": d["A_log"].to(torch.int32)},
    "dt_bias 2-d": lambda d: {"dt_bias": d["dt_bias"][:, None]},
    "ssm wrong rank": lambda d: {"ssm": d["ssm"].flatten(2)},
    "ssm wrong head dim": lambda d: {"ssm": d["ssm"][..., :8]},
    "ssm fp64": lambda d: {"ssm": d["ssm"].double()},
    "ssm strided inner": lambda d: {"ssm": d["ssm"].transpose(2, 3)},
    "read_slot int64": lambda d: {"read_slot": d["read_slot"].long()},
    "write_slot too short": lambda d: {"write_slot": d["write_slot"][:1]},
    "write_slot 2-d": lambda d: {"write_slot": d["write_slot"][:, None]},
    "out wrong dtype": lambda d: {"out": torch.zeros(2, HV, 16, dtype=torch.float64)},
    "out wrong shape": lambda d: {"out": torch.zeros(2, HV, 8)},
    "BV not power of two": lambda d: {"BV": 3},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises(case, device):
    d = _good(device)
    d.update(BAD[case](d))
    if "out" in d:
        d["out"] = d["out"].to(device)
    with pytest.raises(ValueError):
        gdn_decode(**d)


def test_bf16_gate_params_read_as_fp32(device):
    """vLLM keeps dt_bias in the model dtype: a bf16 dt_bias/A_log must give exactly what their
    fp32 upcasts give (the kernel reads both as fp32)."""
    d = _good(device)
    d["A_log"], d["dt_bias"] = d["A_log"].bfloat16(), d["dt_bias"].bfloat16()
    ssm0 = d["ssm"].clone()
    o16 = gdn_decode(**d)
    d["A_log"], d["dt_bias"], d["ssm"] = d["A_log"].float(), d["dt_bias"].float(), ssm0
    o32 = gdn_decode(**d)
    assert torch.equal(o16, o32)


def test_bad_multi_input_raises(device):
    d = _good(device)
    ws2 = torch.full((2, 3), -1, dtype=torch.int32, device=device)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    args = [d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "ssm")]
    gdn_decode_multi(*args, cu, d["read_slot"], ws2)  # the good call works
    with pytest.raises(ValueError):
        gdn_decode_multi(*args, cu.long(), d["read_slot"], ws2)
    with pytest.raises(ValueError):
        gdn_decode_multi(*args, cu, d["read_slot"], ws2[:, 0].contiguous())  # 1-d write_slots
    with pytest.raises(ValueError):
        gdn_decode_multi(*args, torch.tensor([0, 1, 1, 2], dtype=torch.int32, device=device),
                         d["read_slot"], ws2)  # 3 rows, 2 read slots


# ---------------------------------------------------------------------------------------------
# GPU tier: Qwen3-Next shapes (HK 16, HV 32, K = V = 128), bf16 inputs, fp32 state
# ---------------------------------------------------------------------------------------------

Q_HK, Q_HV, Q_K = 16, 32, 128


def _qwen_inputs(T, gpu, seed):
    return make_inputs(T, Q_K, Q_K, torch.bfloat16, gpu, seed=seed, hk=Q_HK, hv=Q_HV)


def _qwen_pool(num_slots, gpu, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # small states, as in a real model, so that one step does not blow up in bf16
    return (0.1 * torch.randn(num_slots, Q_HV, Q_K, Q_K, generator=gen)).to(dtype).to(gpu)


def _qwen_check(pool, pool0, res, inputs, reads, writes, out_tol, state_tol):
    q, k, v, a, b, A_log, dt_bias = inputs
    written = set()
    for i, (r, w) in enumerate(zip(reads, writes)):
        if r == NO_SLOT and w == NO_SLOT:
            assert torch.equal(res[i], torch.zeros_like(res[i]))
            continue
        init = None if r == NO_SLOT else pool0[r]
        o_ref, s_ref = gdn_recurrent_ref(q[i:i + 1], k[i:i + 1], v[i:i + 1], a[i:i + 1],
                                         b[i:i + 1], A_log, dt_bias, init)
        assert rel(res[i], o_ref[0]) < out_tol, f"row {i} output"
        if w != NO_SLOT:
            assert rel(pool[w], s_ref) < state_tol, f"row {i} state"
            written.add(w)
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    assert torch.equal(pool[untouched], pool0[untouched])


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 64, 77])
def test_gpu_qwen_shapes(N, state_dtype, gpu):
    inputs = _qwen_inputs(N, gpu, seed=N)
    pool = _qwen_pool(2 * N + 8, gpu, state_dtype, seed=N)
    pool0 = pool.clone()
    kinds = ["move", "inplace", "fresh", "drop", "pad"] if N > 1 else ["move"]
    kinds = [kinds[i % len(kinds)] for i in range(N)]
    reads, writes = slot_layout(kinds, pool.shape[0], random.Random(N))
    rs = torch.tensor(reads, dtype=torch.int32, device=gpu)
    ws = torch.tensor(writes, dtype=torch.int32, device=gpu)
    res = gdn_decode(*inputs, pool, rs, ws)
    torch.cuda.synchronize()
    _qwen_check(pool, pool0, res, inputs, reads, writes, 2e-2, STATE_TOL[state_dtype])


@pytest.mark.gpu
def test_gpu_qwen_multi(gpu):
    _ = NO_SLOT
    lens = [4, 0, 1, 3, 2]
    reads = [0, _, _, 3, 9]
    write_slots = [[10, 11, 12, 13], [1, 1, 1, 1], [14, _, _, _], [_, _, 3, _], [_, 15, _, _]]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    q, k, v, a, b, A_log, dt_bias = _qwen_inputs(cu[-1], gpu, seed=5)
    pool = _qwen_pool(16, gpu, seed=5)
    pool0 = pool.clone()
    out = gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, pool,
                           torch.tensor(cu, dtype=torch.int32, device=gpu),
                           torch.tensor(reads, dtype=torch.int32, device=gpu),
                           torch.tensor(write_slots, dtype=torch.int32, device=gpu))
    torch.cuda.synchronize()
    written = set()
    for i in range(len(lens)):
        s, e = cu[i], cu[i + 1]
        if s == e:
            continue
        init = None if reads[i] == NO_SLOT else pool0[reads[i]]
        o_ref, _s, states = gdn_recurrent_ref(q[s:e], k[s:e], v[s:e], a[s:e], b[s:e], A_log,
                                              dt_bias, init, return_all_states=True)
        assert rel(out[s:e], o_ref) < 2e-2
        for t in range(e - s):
            if write_slots[i][t] != NO_SLOT:
                assert rel(pool[write_slots[i][t]], states[t]) < 1e-5
                written.add(write_slots[i][t])
    untouched = [s for s in range(16) if s not in written]
    assert torch.equal(pool[untouched], pool0[untouched])
    # the same launch with programmatic dependent launch: bit for bit
    pool_pdl = pool0.clone()
    out_pdl = gdn_decode_multi(q, k, v, a, b, A_log, dt_bias, pool_pdl,
                               torch.tensor(cu, dtype=torch.int32, device=gpu),
                               torch.tensor(reads, dtype=torch.int32, device=gpu),
                               torch.tensor(write_slots, dtype=torch.int32, device=gpu), pdl=True)
    assert torch.equal(out_pdl, out) and torch.equal(pool_pdl, pool)


@pytest.mark.gpu
@pytest.mark.parametrize("BV,num_warps", [(4, 1), (8, 1), (16, 2), (32, 4), (64, 8)])
def test_gpu_tile_configs(BV, num_warps, gpu):
    N = 32
    inputs = _qwen_inputs(N, gpu, seed=1)
    pool = _qwen_pool(2 * N + 1, gpu, seed=1)
    pool0 = pool.clone()
    reads, writes = list(range(N)), list(range(N, 2 * N))
    res = gdn_decode(*inputs, pool, torch.tensor(reads, dtype=torch.int32, device=gpu),
                     torch.tensor(writes, dtype=torch.int32, device=gpu), BV=BV,
                     num_warps=num_warps)
    torch.cuda.synchronize()
    _qwen_check(pool, pool0, res, inputs, reads, writes, 2e-2, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("BV,num_warps,nsub", [(8, 1, 2), (8, 1, 4), (16, 2, 2), (16, 2, 4),
                                               (16, 1, 8)])
def test_gpu_subtiles_equal_one_tile_bitwise(BV, num_warps, nsub, pool_dtype, gpu):
    """On the GPU (the compiled loop), Qwen3-Next shapes: nsub tiles per program give exactly
    the outputs and states of one tile per program with the same (BV, num_warps)."""
    N = 48
    inputs = _qwen_inputs(N, gpu, seed=nsub)
    pool = _qwen_pool(2 * N + 1, gpu, dtype=pool_dtype, seed=nsub)
    pool1 = pool.clone()
    rs = torch.arange(N, dtype=torch.int32, device=gpu)
    ws = torch.arange(N, 2 * N, dtype=torch.int32, device=gpu)
    o = gdn_decode(*inputs, pool, rs, ws, BV=BV, num_warps=num_warps, nsub=nsub)
    o1 = gdn_decode(*inputs, pool1, rs, ws, BV=BV, num_warps=num_warps)
    torch.cuda.synchronize()
    assert torch.equal(bits(o), bits(o1)) and torch.equal(bits(pool), bits(pool1))


@pytest.mark.gpu
def test_gpu_deterministic_and_graph_replay(gpu):
    """Two eager runs into fresh copies of a pool, and a CUDA-graph replay, agree bit for bit."""
    N = 64
    inputs = _qwen_inputs(N, gpu, seed=2)
    base = _qwen_pool(2 * N, gpu, seed=2)
    rs = torch.arange(N, dtype=torch.int32, device=gpu)
    ws = torch.arange(N, 2 * N, dtype=torch.int32, device=gpu)
    results = []
    for _ in range(2):
        pool = base.clone()
        o = gdn_decode(*inputs, pool, rs, ws)
        results.append((o, pool))
    torch.cuda.synchronize()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])

    pool = base.clone()
    out = torch.zeros(N, Q_HV, Q_K, dtype=torch.bfloat16, device=gpu)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gdn_decode(*inputs, pool, rs, ws, out=out)  # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gdn_decode(*inputs, pool, rs, ws, out=out)
    pool.copy_(base)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, results[0][0]) and torch.equal(pool, results[0][1])
