"""GatedDeltaNet chunk prefill on FlashInfer's kernel, with gdn_chunk_prefill's contract.

Where FlashInfer is present (an optional dependency: vLLM ships it; never required) its SM90 chunk
prefill is 2-4x faster than our Triton kernel with several sequences on an H200 (kernel alone).
``gdn_fi_prefill`` runs it inside our guarantees; on the GPU the whole call is 1.44x ours at
8 x 2048, but issuing FlashInfer's call eagerly costs 0.2-0.35 ms of host time (its CuTe-DSL
argument handling), so calls of a few thousand tokens ran at the host's pace
(profiling/results/2026-12-02/SUMMARY.md, fourteenth stop). ``fi_capture`` therefore captures
that call once per (rows, checkpoint interval) in a CUDA graph over the workspace's persistent
buffers; a call then replays it. The steps:

    1. fi_prep     (Triton) l2-normalised q, k and contiguous v in the input dtype (v written by
                   the conv instead when the caller says so: ``v_in_workspace``), alpha = exp(g)
                   and beta = sigmoid(b) in fp32, int64 cu_seqlens and checkpoint offsets, into a
                   caller-owned FiWorkspace; padding rows of ``out`` zeroed
    2. fi_gather   (Triton) initial states from the read slots (FlashInfer's initial_state is one
                   state per sequence, not indexed by slot)
    3. FlashInfer  chunk_gated_delta_rule(use_cp=False) over the whole workspace (max_tokens
                   rows, the live ones given by cu64): outputs into the workspace's ``out``,
                   final states over the gathered initial states, a checkpoint every ``every``
                   tokens of each span into the workspace; a graph replay where fi_capture made
                   one for (num_seqs, every, scale), else the same call eagerly
    4. fi_scatter  (Triton) the checkpoints that fall on block boundaries into ckpt_slots, the
                   final states into write slots, validated and masked exactly like chunk.py
    5. fi_out      (Triton) the outputs from the workspace's ``out`` into their rows of ``out``
                   (one copy: the graph's output buffer is fixed, the caller's ``out`` is not)

Groups: a call of more sequences than the workspace holds (``max_seqs``, the rows of its initial
states) runs steps 1-5 once per group of up to max_seqs consecutive sequences, the workspace
holding the group's tokens from its row 0. FlashInfer computes every (sequence, head) in one
program of its own from that sequence's tokens and state only, so a sequence's bits do not
depend on the group it ran in (the same argument as a larger workspace: below).

Why the whole workspace: a CUDA graph keeps the tensor extents of its capture, so the call has
the same extents whatever T. The prep writes the rows past the live tokens up to T + 63 as zeros
(alpha 1): the rows FlashInfer's TMA tiles read past the last span, and what they read past the
end of an exact-size tensor. So the bits do not depend on the workspace's size or on what an
earlier call left there (GPU test), and a replay computes what the eager call does.

Alignment (why ``every``): FlashInfer counts checkpoints (and its 64-token chunks) from each span's
start, ours are at absolute multiples of B. With every start n a multiple of ``every`` and
``every`` dividing B, every block boundary p = (n // B + 1 + e) * B lies ``p - n`` tokens in, a
multiple of ``every``: it is one of FlashInfer's checkpoints. ``every = B`` (default) stores only
what is needed when all starts are block-aligned (fresh prompts, prefix-cache hits, chunked
prefill clipped to blocks); ``fi_every`` picks the largest valid value otherwise (a start at a
64-multiple inside a block: every 64 or 128 ...), at the price of checkpoints that are stored and
dropped. A start that is not a multiple of ``every`` gets no checkpoint stored (ERR_META).

Warm == cold: FlashInfer's state is fp32 in registers across chunks of 64 tokens from the span's
start, a checkpoint is that register state stored as fp32, and an initial state is loaded into
those registers as is; each chunk's arithmetic depends only on its tokens and the entering state
(its first chunk differs only by masking rows beyond its length, a no-op for a full chunk). So
when every start is a multiple of 64 (README, Conventions: chunk alignment), a run resuming from
a stored block state repeats the cold run's chunks on the same state bits. The GPU tier checks it
(tests/test_fi_prefill.py). The prep is per token (no batch dependence) for the same reason.

fp32 pools only: with a bf16 pool our kernel rounds the running state at every block boundary so
a warm run (which starts from the rounded state) matches the cold one; FlashInfer carries fp32
across boundaries, so a bf16 pool would break warm == cold. Callers use gdn_chunk_prefill there
(``fi_unsupported`` says why).
"""

from __future__ import annotations

import functools
import math

import torch

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.chunk import _check_inputs
from gdn_graphs.ops.common import check_flag, fail, interpreting
from gdn_graphs.ops.fi_kernels import fi_gather, fi_out, fi_prep, fi_scatter
from gdn_graphs.ops.meta import ChunkMeta

__all__ = ["FiWorkspace", "gdn_fi_prefill", "fi_every", "fi_unsupported", "load_fi", "fi_route",
           "make_fi_workspace", "fi_capture", "fi_intervals"]

_fail = functools.partial(fail, "gdn_fi_prefill")


class FiWorkspace:
    """Persistent buffers of gdn_fi_prefill for up to ``max_tokens`` tokens and ``max_seqs``
    sequences per FlashInfer call (a call with more runs them in groups of max_seqs), and up to ``max_checkpoints`` FlashInfer checkpoints (a call with T tokens
    and interval ``every`` needs T // every; default max_tokens // 256). Allocate once, outside
    any graph; one serves every layer (it carries data only within a call).

    q, k [max_tokens, HK, K], v and out [max_tokens, HV, V] in the input dtype; alpha, beta
    [max_tokens, HV] fp32; cu64, ckcu [max_seqs + 1] int64; h0 [max_seqs, HV, V, K] fp32 (the
    initial states in, FlashInfer's final states out: each of its programs loads its own
    (sequence, head) state before it stores it); ckpt [max_checkpoints, HV, V, K] fp32. All
    zero-initialised. ``graphs``: fi_capture's CUDA graphs by (fn, num_seqs, every, scale);
    ``calls``: how many calls replayed one ("graph") and how many ran eagerly ("eager").
    """

    def __init__(self, max_tokens, max_seqs, HK, HV, K, V, dtype, device, max_checkpoints=None,
                 fn=None):
        if dtype not in (torch.bfloat16, torch.float16):
            fail("FiWorkspace", f"FlashInfer takes bf16/fp16 inputs, got {dtype}")
        if min(max_tokens, max_seqs, HK, HV, K, V) < 1 or HV % HK:
            fail("FiWorkspace", f"need positive sizes and HV % HK == 0, got {max_tokens}, {max_seqs}, "
                 f"HK={HK}, HV={HV}, K={K}, V={V}")
        self.max_tokens, self.max_seqs = int(max_tokens), int(max_seqs)
        self.HK, self.HV, self.K, self.V, self.dtype = int(HK), int(HV), int(K), int(V), dtype
        self.max_checkpoints = max(1, int(max_tokens // 256 if max_checkpoints is None else max_checkpoints))
        self.device = torch.device(device)
        self.fn = fn  # the chunk_gated_delta_rule to call (None: FlashInfer's; tests: a stand-in)
        n, f32 = self.max_tokens, dict(dtype=torch.float32, device=device)
        self.q = torch.zeros(n, HK, K, dtype=dtype, device=device)
        self.k = torch.zeros(n, HK, K, dtype=dtype, device=device)
        self.v = torch.zeros(n, HV, V, dtype=dtype, device=device)
        self.out = torch.zeros(n, HV, V, dtype=dtype, device=device)
        self.alpha = torch.zeros(n, HV, **f32)
        self.beta = torch.zeros(n, HV, **f32)
        self.cu64 = torch.zeros(self.max_seqs + 1, dtype=torch.int64, device=device)
        self.ckcu = torch.zeros(self.max_seqs + 1, dtype=torch.int64, device=device)
        self.h0 = torch.zeros(self.max_seqs, HV, V, K, **f32)
        self.ckpt = torch.zeros(self.max_checkpoints, HV, V, K, **f32)
        self.device = self.q.device  # "cuda" -> "cuda:0": what the inputs' devices compare to
        self.graphs: dict = {}
        self.calls = {"graph": 0, "eager": 0}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (
            self.q, self.k, self.v, self.out, self.alpha, self.beta, self.cu64, self.ckcu, self.h0,
            self.ckpt))


@functools.lru_cache(maxsize=None)
def load_fi():
    """FlashInfer's chunk_gated_delta_rule, or (None, why not)."""
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - optional dependency
        return None, f"flashinfer does not import ({e.__class__.__name__}: {str(e)[:200]})"
    return chunk_gated_delta_rule, None


def fi_every(block_size: int, starts) -> int | None:
    """The checkpoint interval for spans starting at ``starts``: the largest multiple of 64
    dividing block_size and every start (block_size when all are block-aligned), or None when a
    start is not a multiple of 64 (FlashInfer's chunks would not be aligned to absolute
    positions: warm == cold would not hold, and block boundaries would not be chunk ends)."""
    g = block_size
    for s in starts:
        g = math.gcd(g, int(s) % block_size)
    return g if g % CHUNK == 0 else None


def fi_unsupported(q, v, ssm, out=None) -> str | None:
    """Why gdn_fi_prefill cannot run these tensors on this machine (None: it can)."""
    fn, why = load_fi()
    if fn is None:
        return why
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "FlashInfer's prefill path is used on SM90 (Hopper) only"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"FlashInfer takes bf16/fp16 inputs, got {q.dtype}"
    if ssm.dtype != torch.float32:
        return ("a 16-bit pool needs the state rounded at every block boundary (warm == cold); "
                "FlashInfer carries fp32: our kernel runs")
    if q.shape[2] != 128 or v.shape[2] != 128:
        return f"FlashInfer's SM90 kernel takes K = V = 128, got {q.shape[2]}, {v.shape[2]}"
    if out is not None and (out.dtype != q.dtype or not out.is_contiguous()):
        return "out must be contiguous and of q's dtype (FlashInfer writes it)"
    return None


def _check_fi(q, v, ssm, meta, out, ws, num_seqs, every, n_ck):
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if q.dtype not in (torch.bfloat16, torch.float16):
        _fail(f"FlashInfer takes bf16/fp16 inputs, got {q.dtype}")
    if ssm.dtype != torch.float32:
        _fail(f"the pool must be fp32 (a 16-bit pool needs our kernel), got {ssm.dtype}")
    if out.dtype != q.dtype or not out.is_contiguous() or tuple(out.shape) != (T, HV, V):
        _fail(f"out must be a contiguous {(T, HV, V)} tensor of q's dtype, got {tuple(out.shape)} "
              f"{out.dtype} strides {out.stride()}")
    if not isinstance(ws, FiWorkspace):
        _fail("workspace must be a FiWorkspace")
    if (ws.HK, ws.HV, ws.K, ws.V) != (HK, HV, K, V) or ws.dtype != q.dtype or ws.q.device != q.device:
        _fail(f"workspace (HK={ws.HK}, HV={ws.HV}, K={ws.K}, V={ws.V}, {ws.dtype}, {ws.q.device}) does "
              f"not fit HK={HK}, HV={HV}, K={K}, V={V}, {q.dtype}, {q.device}")
    if T > ws.max_tokens or n_ck > ws.max_checkpoints:  # (sequences: in groups of ws.max_seqs)
        _fail(f"workspace holds {ws.max_tokens} tokens / {ws.max_checkpoints} checkpoints, the call "
              f"needs {T} / {n_ck}")
    if not 0 <= num_seqs <= meta.max_seqs or (meta.num_seqs is not None and num_seqs < meta.num_seqs):
        _fail(f"num_seqs = {num_seqs} must cover the meta's {meta.num_seqs} live sequences and fit "
              f"its {meta.max_seqs}")
    if every < CHUNK or every % CHUNK or meta.block_size % every:
        _fail(f"every = {every} must be a multiple of {CHUNK} dividing block_size {meta.block_size}")


def gdn_fi_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta: ChunkMeta, out, workspace: FiWorkspace,
                   scale=None, error_flag=None, num_seqs: int | None = None, every: int | None = None,
                   fi_fn=None, v_in_workspace: bool = False):
    """gdn_chunk_prefill's contract on FlashInfer's kernel (module docstring for the scheme).

    Args as gdn_chunk_prefill (q, k [T, HK, K] and v [T, HV, V] views with contiguous heads; a, b
    [T, HV]; A_log, dt_bias [HV]; ``ssm`` [num_slots, HV, V, K] MUTATED at the write and
    checkpoint slots only, read slots read first; ``meta``; ``error_flag``), except:
        q, k, v: bf16 or fp16; ssm: fp32 (any slot stride).
        out: [T, HV, V] contiguous, q's dtype, required. MUTATED: live rows get the outputs,
            rows >= cu_seqlens[num_seqs] zeros.
        workspace: FiWorkspace, required (no allocation per call).
        num_seqs: host count of the sequences to run (default meta.num_seqs, else meta.max_seqs):
            FlashInfer's grid is num_seqs x HV (in groups of workspace.max_seqs, one call each,
            where num_seqs is larger); rows past it must be empty (else ERR_META).
        every: FlashInfer's checkpoint interval (default meta.block_size): a multiple of 64 that
            divides block_size and every start position (fi_every computes it on the host).
        fi_fn: the chunk_gated_delta_rule to call (default workspace.fn, else FlashInfer's;
            tests inject a stand-in).
        v_in_workspace: the caller has written v's T rows into ``workspace.v`` already
            (conv_prefill with tail_out=workspace.v[:T] viewed [T, HV * V]: the prep's copy of v
            is then skipped; ``v`` gives shapes only). A call of one group only (num_seqs <=
            workspace.max_seqs): later groups' tokens must move to the workspace's row 0.
    Returns ``out``. No host sync, no allocation; FlashInfer compiles its kernel on first use
    (one configuration for every call here: initial state and checkpoints always on). Its call
    replays a graph of fi_capture's when there is one for (fn, num_seqs, every, scale) and no
    capture is under way, else runs eagerly on the same buffers (the same bits: GPU test).
    """
    _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, meta, out, None)
    check_flag("gdn_fi_prefill", error_flag, q.device, ref="q")
    T, HK, K = q.shape
    ns = (meta.max_seqs if meta.num_seqs is None else meta.num_seqs) if num_seqs is None else int(num_seqs)
    every = meta.block_size if every is None else int(every)
    n_ck = T // every  # >= sum_i len_i // every: FlashInfer's checkpoint indices stay below it
    if out is None:
        _fail("out is required (FlashInfer writes it in place)")
    _check_fi(q, v, ssm, meta, out, workspace, ns, every, n_ck)
    if v_in_workspace and ns > workspace.max_seqs:
        _fail(f"v_in_workspace needs one group: {ns} sequences, the workspace holds "
              f"{workspace.max_seqs} a call")
    fi_fn = fi_fn or workspace.fn
    if fi_fn is None:
        fi_fn, why = load_fi()
        if fi_fn is None:
            _fail(why)
    if T == 0:
        return out
    if ns == 0:
        return out.zero_()
    ws = workspace
    sc = K ** -0.5 if scale is None else float(scale)
    T_ws = min(T + CHUNK - 1, ws.max_tokens)
    for s0 in range(0, ns, ws.max_seqs):  # groups of up to max_seqs sequences (module docstring)
        n = min(ws.max_seqs, ns - s0)
        fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, n, every, error_flag, interpreting(),
                T_ws=T_ws, seq0=s0, ns_total=ns, v_ready=v_in_workspace)
        fi_gather(ssm, ws, meta, n, error_flag, seq0=s0)
        graph = ws.graphs.get((fi_fn, n, every, sc))
        if graph is not None and not torch.cuda.is_current_stream_capturing():
            graph.replay()
            ws.calls["graph"] += 1
        else:
            _fi_call(fi_fn, ws, n, every, sc)
            ws.calls["eager"] += 1
        fi_scatter(ssm, ws, meta, n, n_ck, every, error_flag, seq0=s0)
        fi_out(ws, out, meta, n, seq0=s0)
    return out


def _fi_call(fn, ws: FiWorkspace, ns: int, every: int, scale: float):
    """FlashInfer's call over the whole workspace (fixed extents: a graph of it serves any T)."""
    h = ws.h0[:ns]
    fn(ws.q, ws.k, ws.v, g=ws.alpha, beta=ws.beta, scale=scale, initial_state=h,
       output_final_state=True, cu_seqlens=ws.cu64[:ns + 1], output=ws.out, output_state=h,
       state_checkpoints=ws.ckpt, checkpoint_cu_starts=ws.ckcu[:ns + 1],
       checkpoint_every_n_tokens=every, use_cp=False)


def fi_intervals(block_size: int) -> list[int]:
    """Every checkpoint interval fi_every can return for ``block_size``: the multiples of 64 that
    divide it."""
    return [e for e in range(CHUNK, block_size + 1, CHUNK) if block_size % e == 0]


def fi_capture(workspace: FiWorkspace, block_size: int, scale: float | None = None,
               fi_fn=None) -> int:
    """Capture FlashInfer's call (step 3 of gdn_fi_prefill) in one CUDA graph per (num_seqs,
    every) a step on ``block_size`` can take: num_seqs 1 .. max_seqs, every in
    fi_intervals(block_size), at ``scale`` (default K ** -0.5). Calls with another scale or fn
    run eagerly. Runs the call once eagerly first (FlashInfer compiles its kernel on first use,
    which must not happen inside a capture). Captures on a side stream in thread-local mode (so
    other threads of the process may allocate meanwhile); FlashInfer allocates nothing in these
    calls, so the graphs hold no memory of their own. Outside any capture, before serving: it
    synchronises the device. Returns the number of graphs made (0 off CUDA)."""
    ws = workspace
    if not ws.q.is_cuda:
        return 0
    # (vLLM makes the workspace in its profile run, under inference mode: its tensors can only
    # be written in place there)
    with torch.inference_mode():
        return _capture_all(ws, block_size, scale, fi_fn)


def _capture_all(ws, block_size, scale, fi_fn):
    """fi_capture's work, under inference mode."""
    fn = fi_fn or ws.fn
    if fn is None:
        fn, why = load_fi()
        if fn is None:
            _fail(why)
    sc = ws.K ** -0.5 if scale is None else float(scale)
    # the eager call, on one span of up to 64 tokens (inside the workspace, with its checkpoint
    # when it is a whole chunk): compiles, and proves the call works
    n = min(CHUNK, ws.max_tokens)
    ws.cu64[:2] = torch.tensor([0, n], device=ws.device)
    ws.ckcu[:2] = torch.tensor([0, n // CHUNK], device=ws.device)
    _fi_call(fn, ws, 1, CHUNK, sc)
    ws.cu64.zero_()
    ws.ckcu.zero_()
    torch.cuda.synchronize(ws.device)
    pool = torch.cuda.graph_pool_handle()
    side = torch.cuda.Stream(ws.device)
    made = 0
    with torch.cuda.device(ws.device), torch.cuda.stream(side):
        for every in fi_intervals(block_size):
            for ns in range(1, ws.max_seqs + 1):
                key = (fn, ns, every, sc)  # gdn_fi_prefill's lookup
                if key in ws.graphs:
                    continue
                g = torch.cuda.CUDAGraph()
                g.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    _fi_call(fn, ws, ns, every, sc)
                finally:
                    g.capture_end()
                ws.graphs[key] = g
                made += 1
    torch.cuda.synchronize(ws.device)
    return made


def make_fi_workspace(max_tokens, max_seqs, HK, HV, K, V, dtype, state_dtype, device,
                      max_checkpoints=None):
    """(FiWorkspace, None) where the FlashInfer path can run for these shapes and dtypes on this
    device, else (None, why not). ``max_seqs``: prefill rows per FlashInfer call (a step with
    more runs its rows in groups); ``max_checkpoints`` default max_tokens // 64 (every step fits whatever
    interval its starts need)."""
    q = torch.empty(0, HK, K, dtype=dtype, device=device)
    why = fi_unsupported(q, torch.empty(0, HV, V, dtype=dtype, device=device),
                         torch.empty(0, HV, V, K, dtype=state_dtype, device=device))
    if why is not None:
        return None, why
    n_ck = max_tokens // CHUNK if max_checkpoints is None else max_checkpoints
    return FiWorkspace(max_tokens, max_seqs, HK, HV, K, V, dtype, device, max_checkpoints=n_ck), None


def fi_route(workspace, step, T: int, ssm, out):
    """(every, num_seqs) when ``step``'s prefill (T tokens, into ``out``) runs on FlashInfer's
    kernel, else None (our kernel runs). It does when the chunk workspace carries a FiWorkspace
    (``workspace.fi``, made by make_fi_workspace), the step has its host plan (a capture-time
    template has none), every prefill start is a multiple of 64 (fi_every), the step fits the
    FiWorkspace, and the pool is fp32. Never while a CUDA graph is being captured: a replay would
    keep this step's num_seqs and interval for other batches (our kernel's launches depend only
    on the buffers). Host values only: no sync."""
    fw = getattr(workspace, "fi", None)
    host = getattr(step, "host", None)
    if (fw is None or host is None or ssm.dtype != torch.float32 or not out.is_contiguous()
            or out.dtype != fw.dtype):
        return None
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    every = fi_every(step.prefill.block_size, host.prefill_starts)
    ns = host.num_prefills
    if every is None or T > fw.max_tokens or T // every > fw.max_checkpoints:
        return None
    return every, ns
