"""Benchmark the chunked GDN prefill (gdn_chunk_prefill) on the device (Qwen3-Next shapes), side by
side with fla-core, vLLM's Triton path and FlashInfer.

    python3 profiling/bench_prefill.py --out DIR [--quick] [--tp 1,2] [--only ours,fla,vllm,fi,vllm_fi]

Shapes: K = V = 128, bf16 inputs, fp32 pool; heads HK 16 / HV 32 (TP 1) and HK 8 / HV 16 (TP 2,
--tp); batches 1x8192, 8x2048, 4x16384 (every sequence fresh: read slot -1). Checkpoints off (no
block boundary inside any span), on with B = 256 and on with B = 1024 (each checkpoint into its
own slot). It reports
  * M tokens/s per layer: median of triton.testing.do_bench over the whole call (both kernels,
    persistent out and workspace as under a CUDA graph), plus each kernel alone;
  * checkpoint cost: time with checkpoints / time without - 1, in %;
  * peak extra memory of one call that allocates its own out and workspace
    (torch.cuda.max_memory_allocated delta), and the workspace size;
  * fla-core's chunk_gated_delta_rule side by side when it imports (given the log decay g and
    beta = sigmoid(b) precomputed, use_qk_l2norm_in_kernel=True, cu_seqlens, final states out; it
    stores no block states), with the relative difference of its outputs and final states to ours;
  * vLLM's Triton path (vllm.third_party.flash_linear_attention.ops.chunk_gated_delta_rule, or
    vllm.model_executor.layers.fla.ops in older vLLM) when vLLM imports, called as vLLM calls it
    (g, beta precomputed, l2norm in kernel, a zero initial state per sequence, chunk indices
    precomputed), with its relative differences to ours;
  * FlashInfer's flashinfer.gdn_prefill.chunk_gated_delta_rule when it imports (vLLM 0.26's default
    GDN prefill on SM90). Its kernel alone: q and k l2-normalised, alpha = exp(g) and beta =
    sigmoid(b) in fp32 precomputed outside the timing (that prep is timed on its own, "prep ms",
    plain torch ops). Columns: no checkpoints with use_cp="auto" (what vLLM gets: the
    context-parallel kernel when num_seqs * HV < SMs / 2), no checkpoints with use_cp=False (only
    where auto picks CP), its own checkpoints every B = 256 / 1024 tokens into a side tensor, and
    "pool": the same plus our scatter of its checkpoints (and final states) into the pool slots
    ours writes, timed together (the scatter alone too). Relative differences of its outputs,
    final states and pool states to ours. "ours via FI" (columns "via B=256 / 1024"): our
    prefill on FlashInfer's kernel, gdn_graphs.ops.fi_prefill.gdn_fi_prefill, with everything
    included in the time (fused Triton prep of q, k, v, alpha, beta from the raw views, gather of
    the initial states from the read slots, FlashInfer with checkpoints every B, Triton scatter
    into the pool slots ours writes), with its differences to ours; "via B=256 e64": the same
    with FlashInfer storing a state every 64 tokens (what a step pays when one of its rows starts
    inside a block: the scatter keeps the boundaries); every FlashInfer column also
    gets its speed relative to FlashInfer without checkpoints ("vs FI off" line). Its kernels
    compile on first use of a configuration (8-17 s each, MLIR -> PTX): that first call is timed
    apart ("first call s") and kept out of the medians;
  * "vLLM default (FI)" (column vllm_fi) when vLLM and FlashInfer import: what vLLM 0.26 runs per
    GDN layer for a prefill batch on SM90, through vLLM's own functions, timed as one call with a
    persistent fp32 pool [slots, HV, V, K]: fused_post_conv_prep on the conv output [T, 2*HK*K +
    HV*V] (the packed tensor q, k, v are views of; split, l2norm of q and k, g and beta, one
    Triton kernel), the gather ssm_state[state_indices] with the rows without an initial state
    zeroed (all of them: every sequence is fresh), fi_chunk_gated_delta_rule (vLLM's wrapper:
    contiguous, fp32 casts, exp(g), FlashInfer's chunk_gated_delta_rule; no checkpoints) and the
    scatter of the final states into the slots. Relative differences of its outputs and pool
    states to ours; its speed against "FI off" (the kernel alone) in the "vs FI off" line, and
    "ours via FI / vLLM default (FI)" (> 1: ours via FI faster, checkpoints included). It is
    also replayed from a CUDA graph (the zeroing as a masked multiply: the boolean index syncs),
    its GPU work alone, on the "CUDA graphs" line beside ours and FlashInfer's kernels replayed,
    and replayed again with a bf16 pool beside ours with one ("graphs bf16 pool": vLLM's default
    state dtype for a bf16 model);
  * a sweep of the launch knobs (ChunkConfig: bv, warps_seq, stages; warps_intra on the parallel
    kernel alone) on 1x8192 with B = 256 (TP-1 heads), the best three re-timed on the other shapes.
A column that fails prints its error in its row; the other columns go on. Prints a table last;
writes DIR/bench_prefill.json (date, commit, device, versions, every number) and
DIR/bench_prefill.png (if matplotlib imports). About 1-2.5 minutes on an H200 for ours and fla at
TP 1 (measured before the other columns existed; less with --quick). `--quick --only
ours,fi,vllm_fi --tp 1,2 --no-sweep --no-fla` took 126 s on an H100, FlashInfer's and vLLM's
first-use compiles included (2026-12-07, profiling/results/2026-12-07/s35_gpu/call3/).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TP_HEADS = {1: (16, 32), 2: (8, 16)}  # (HK, HV) per tensor-parallel degree of Qwen3-Next
HK, HV, K, V = 16, 32, 128, 128       # the heads of the TP degree being run (set_tp)
SHAPES = [(1, 8192), (8, 2048), (4, 16384)]
MODES = [("off", None), ("B=256", 256), ("B=1024", 1024)]
COLUMNS = ("ours", "fla", "vllm", "fi", "vllm_fi")
# a multiple of 64 beyond every position and below the kernels' cap on positions and block sizes
# (gdn_graphs.ops.common.MAX_POS = 2**30, not imported here: triton must load after --cpu-dry-run)
OFF_BLOCK = 1 << 29
SWEEP = [dict(bv=bv, warps_seq=w, stages=s) for bv in (16, 32, 64) for w in (4, 8) for s in (2, 3)]
SWEEP_QUICK = [dict(bv=bv, warps_seq=4, stages=s) for bv in (32, 64) for s in (2, 3)]
MiB = 1 << 20
CHUNK_TOKENS = 64  # gdn_graphs.constants.CHUNK (not imported here: see OFF_BLOCK)
DEVICE = "cuda"  # --cpu-dry-run switches to the CPU (Triton interpreter) and tiny shapes


def _int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}")


def _tp_list(text):
    tps = _int_list(text)
    bad = [t for t in tps if t not in TP_HEADS]
    if bad or not tps:
        raise argparse.ArgumentTypeError(f"--tp takes some of {sorted(TP_HEADS)}, got {text!r}")
    return tps


def _columns(text):
    cols = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in cols if c not in COLUMNS]
    if bad or not cols:
        raise argparse.ArgumentTypeError(f"--only takes some of {','.join(COLUMNS)}, got {text!r}")
    return cols


def _shapes(text):
    out = []
    for item in text.split(","):
        try:
            n, L = item.lower().split("x")
            out.append((int(n), int(L)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shapes are NSEQxLEN separated by commas, got {item!r}")
        if out[-1][0] < 1 or out[-1][1] < 64 or out[-1][1] % 64:
            raise argparse.ArgumentTypeError(f"need NSEQ >= 1 and LEN a positive multiple of 64, got {item!r}")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, type=Path, help="directory for bench_prefill.json / .png")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and a smaller knob sweep")
    p.add_argument("--tp", type=_tp_list, default=[1, 2], metavar="1,2",
                   help="tensor-parallel head counts to run: 1 = HK 16 / HV 32, 2 = HK 8 / HV 16 "
                        "(default both)")
    p.add_argument("--only", type=_columns, default=list(COLUMNS), metavar=",".join(COLUMNS),
                   help="columns to time (default all; ours is always run once, untimed, as the "
                        "reference of the differences)")
    p.add_argument("--shapes", type=_shapes, default=None, metavar="1x8192,8x2048",
                   help="batches NSEQxLEN (default 1x8192,8x2048,4x16384)")
    p.add_argument("--no-fla", action="store_true", help="skip the fla-core comparison")
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM's Triton path (and vllm_fi)")
    p.add_argument("--no-fi", action="store_true", help="skip FlashInfer (and vllm_fi)")
    p.add_argument("--no-sweep", action="store_true", help="skip the launch-knob sweep")
    p.add_argument("--sweep-only", action="store_true", help="only the launch-knob sweep")
    p.add_argument("--sweep-worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="check the bookkeeping on the CPU (Triton interpreter, tiny shapes, wall-clock "
                        "timer, no fla/vLLM/FlashInfer); the numbers mean nothing")
    args = p.parse_args(argv)
    dropped = {name for name in ("fla", "vllm", "fi") if getattr(args, f"no_{name}")}
    if dropped & {"vllm", "fi"}:
        dropped.add("vllm_fi")  # needs both
    args.only = [c for c in args.only if c not in dropped]
    return args


def set_tp(tp):
    """Switch the module's head counts to those of tensor-parallel degree ``tp``."""
    global HK, HV
    HK, HV = TP_HEADS[tp]


def shape_name(nseq, L, tp):
    return f"{nseq}x{L}" + ("" if tp == 1 else f" tp{tp}")


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception as e:  # noqa: BLE001 - no git is not fatal
        return f"unknown ({e.__class__.__name__})"


def log(msg, t0=[time.time()]):  # noqa: B006 - a start time shared by all calls
    print(f"[{time.time() - t0[0]:6.1f}s] {msg}", flush=True)


def err_text(e, n=300):
    return f"{e.__class__.__name__}: {str(e)[:n]}"


def rel(x, y):
    """||x - y|| / ||y|| in fp32 (nan when y is all zeros)."""
    x, y = x.float(), y.float()
    return ((x - y).norm() / y.norm()).item()


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------

class Case:
    """Inputs, pool, metas (one per checkpoint mode), persistent out and workspace for one shape."""

    def __init__(self, torch, nseq, L, seed=0):
        from gdn_graphs.ops.chunk import ChunkWorkspace
        from gdn_graphs.ops.meta import chunk_meta, num_checkpoints

        self.nseq, self.L, self.T = nseq, L, nseq * L
        self.HK, self.HV = HK, HV
        dev = DEVICE
        gen = torch.Generator(device=dev).manual_seed(seed)
        T = self.T
        bf = torch.bfloat16
        # q, k, v as views of one packed projection output, as a model would pass them
        qkv = torch.randn(T, 2 * HK * K + HV * V, device=dev, generator=gen, dtype=bf)
        self.qkv = qkv  # = vLLM's conv output (mixed_qkv after causal_conv1d): q, k, v heads in order
        self.q = qkv[:, :HK * K].unflatten(1, (HK, K))
        self.k = qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
        self.v = qkv[:, 2 * HK * K:].unflatten(1, (HV, V))
        ab = torch.randn(T, 2 * HV, device=dev, generator=gen, dtype=bf)
        self.a, self.b = ab[:, :HV], ab[:, HV:]
        self.A_log = torch.log(torch.empty(HV, device=dev).uniform_(1, 16, generator=gen))
        self.dt_bias = torch.randn(HV, device=dev, generator=gen) * 0.5
        need = max(num_checkpoints(0, L, B or OFF_BLOCK) for _, B in MODES) + 1
        self.need = need
        self.pool = torch.zeros(nseq * need, HV, V, K, device=dev)
        self.metas, self.slots = {}, {}
        for name, B in MODES:
            Bk = B or OFF_BLOCK
            nck = num_checkpoints(0, L, Bk)
            writes = [i * need for i in range(nseq)]
            ckpts = [[i * need + 1 + e for e in range(nck)] for i in range(nseq)]
            self.slots[name] = (writes, ckpts)  # host copies: FlashInfer's pool column scatters to them
            self.metas[name] = chunk_meta([L] * nseq, [0] * nseq, [-1] * nseq, writes, ckpts, Bk, device=dev)
        self.out = torch.empty(T, HV, V, device=dev, dtype=bf)
        self.ws = ChunkWorkspace(T, HV, K, V, bf, dev, HK=HK)

    def args(self):
        return (self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias, self.pool)


def bench_ms(triton, fn, quick):
    fn()  # compile outside the timed region
    if DEVICE == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100,
                                   return_mode="median")


def graph_ms(torch, triton, fn, quick):
    """fn captured once in a CUDA graph (after a warm-up call on a side stream), its replays timed:
    the GPU's time without the host's. None off CUDA, where the capture fails, or where a replay's
    output (fn's return, or its first item) differs from the eager call's: a graph that does not
    compute what the eager call did times nothing (why goes to stderr; the eager figures stand
    alone). fn must use persistent buffers only."""
    if DEVICE != "cuda":
        return None

    def first(r):
        return r[0] if isinstance(r, (tuple, list)) else r

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ref = first(fn())
            ref = ref.clone() if torch.is_tensor(ref) else None
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = first(fn())
        graph.replay()
        if ref is not None and not torch.equal(got, ref):
            print("CUDA-graph timing skipped: the replay's output differs from the eager call's",
                  file=sys.stderr, flush=True)
            return None
        ms = bench_ms(triton, graph.replay, quick)
        del graph
        return ms
    except Exception as e:  # noqa: BLE001 - e.g. a kernel that allocates; the eager figure remains
        print(f"CUDA-graph timing skipped: {err_text(e)}", file=sys.stderr, flush=True)
        return None


def peak_extra_mib(torch, fn):
    if DEVICE == "cpu":
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / MiB
    del res
    torch.cuda.empty_cache()
    return extra


def mtok(T, ms):
    return T / (ms * 1e-3) / 1e6


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------

def bench_ours(torch, triton, case, quick, cfg=None):
    """cfg None: the knobs the library picks for this many sequences (chunk_config)."""
    from gdn_graphs.ops.chunk import chunk_intra_fwd, chunk_intra_fwd_for, chunk_seq_fwd_by, gdn_chunk_prefill
    from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
    from gdn_graphs.ops.chunk_intra_gluon import gluon_intra_supported
    from gdn_graphs.ops.workspace import chunk_config

    cfg = cfg or chunk_config(case.nseq, torch.bfloat16, case.HV, gluon_seq_supported(case.v, K))
    gluon_intra = gluon_intra_supported(case.q, K)
    res = dict(config=dict(seq_kernel=cfg.seq_kernel, bv=cfg.bv, warps_seq=cfg.warps_seq,
                           stages=cfg.stages_for(torch.bfloat16),
                           intra_kernel="gluon" if gluon_intra else "triton"))
    for name, _ in MODES:
        meta = case.metas[name]

        def intra_triton():
            return chunk_intra_fwd(
                case.q, case.k, case.a, case.b, case.A_log, case.dt_bias, case.out, case.ws,
                meta, K ** -0.5, num_warps=cfg.warps_intra, dot_precision="tf32", inv_precision="tf32")

        def intra():  # the kernel the library takes here (returns whether the seq kernel makes P)
            return chunk_intra_fwd_for(case.q, case.k, case.a, case.b, case.A_log, case.dt_bias, case.out,
                                       case.ws, meta, K ** -0.5, cfg, "tf32", "tf32")

        def call():
            gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)

        ms = bench_ms(triton, call, quick)
        ms_intra = bench_ms(triton, intra, quick)
        ms_intra_triton = bench_ms(triton, intra_triton, quick) if gluon_intra else ms_intra
        ck = intra_triton()
        own_p = intra()
        ms_seq = bench_ms(triton, lambda: chunk_seq_fwd_by(cfg, case.out, case.v, case.pool, case.ws, meta,
                                                           case.HK, own_p=own_p), quick)
        res[name] = dict(ms=ms, Mtok_s=mtok(case.T, ms), ms_intra=ms_intra, ms_intra_triton=ms_intra_triton,
                         ms_seq=ms_seq,
                         checkpoints=int(meta.ckpt_offsets[-1].item()),
                         intra_regs=getattr(ck, "n_regs", None), intra_spills=getattr(ck, "n_spills", None))
    off = res["off"]["ms"]
    for name, _ in MODES[1:]:
        res[name]["ckpt_cost_pct"] = 100.0 * (res[name]["ms"] / off - 1.0)
    meta = case.metas["B=256"]
    res["B=256"]["ms_graph"] = graph_ms(torch, triton, lambda: gdn_chunk_prefill(
        *case.args(), meta, out=case.out, workspace=case.ws, config=cfg), quick)
    # the same with a bf16 pool (vLLM's default state dtype for a bf16 model)
    args16 = case.args()[:-1] + (case.pool.to(torch.bfloat16),)
    res["B=256"]["ms_graph_bf16_pool"] = graph_ms(torch, triton, lambda: gdn_chunk_prefill(
        *args16, meta, out=case.out, workspace=case.ws, config=cfg), quick)
    del args16
    res["peak_extra_MiB"] = peak_extra_mib(torch, lambda: gdn_chunk_prefill(*case.args(), meta, config=cfg))
    res["workspace_MiB"] = case.ws.nbytes() / MiB
    return res


# ---------------------------------------------------------------------------------------------
# fla-core
# ---------------------------------------------------------------------------------------------

def load_fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule, None
    except Exception as e:  # noqa: BLE001 - optional
        return None, f"{e.__class__.__name__}: {e}"


def bench_fla(torch, triton, fla_fn, case, quick):
    import torch.nn.functional as F
    T = case.T
    # contiguous copies made here, outside the timing: fla would copy our packed views itself
    q = case.q.contiguous().unsqueeze(0)
    k = case.k.contiguous().unsqueeze(0)
    v = case.v.contiguous().unsqueeze(0)
    g = (-torch.exp(case.A_log) * F.softplus(case.a.float() + case.dt_bias)).unsqueeze(0)
    beta = torch.sigmoid(case.b.float()).to(case.b.dtype).unsqueeze(0)
    cu = torch.arange(0, T + 1, case.L, device=DEVICE, dtype=torch.long)
    kw = dict(scale=K ** -0.5, initial_state=None, output_final_state=True,
              use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    if "cu_seqlens_cpu" in inspect.signature(fla_fn).parameters:
        kw["cu_seqlens_cpu"] = cu.cpu()

    def call():
        return fla_fn(q, k, v, g, beta, **kw)

    for _ in range(3):  # its autotuner runs on the first calls
        call()
    ms = bench_ms(triton, call, quick)
    o, ht = call()
    res = dict(ms=ms, Mtok_s=mtok(T, ms), peak_extra_MiB=peak_extra_mib(torch, call))
    # agreement with ours (no checkpoints; FLA's state is [N, HV, K, V], ours [V, K] per head)
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    meta = case.metas["off"]
    gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws)
    ours_state = torch.stack([case.pool[int(s)] for s in meta.write_slot.tolist()])
    rel = lambda x, y: ((x.float() - y.float()).norm() / y.float().norm()).item()  # noqa: E731
    res["rel_diff_out"] = rel(case.out, o[0])
    res["rel_diff_state"] = rel(ours_state, ht.transpose(-1, -2))
    return res


# ---------------------------------------------------------------------------------------------
# ours as the reference of every comparison
# ---------------------------------------------------------------------------------------------

def ours_reference(torch, case):
    """Ours without checkpoints: out [T, HV, V] and final states [nseq, HV, V, K] (clones)."""
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    meta = case.metas["off"]
    gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws)
    writes, _ = case.slots["off"]
    idx = torch.tensor(writes, device=DEVICE, dtype=torch.long)
    return dict(out=case.out.clone(), state=case.pool.index_select(0, idx))


def state_diffs(state, ref):
    """Relative difference of states [.., HV, V, K] to ours, as given and with the last two dims
    swapped (the layout that matches shows the small number)."""
    return dict(rel_diff_state=rel(state, ref), rel_diff_state_T=rel(state.transpose(-1, -2), ref))


def first_call_s(torch, fn):
    """Wall-clock seconds of one call, synchronised (a kernel's compile on first use)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    res = fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, res


# ---------------------------------------------------------------------------------------------
# vLLM's Triton path
# ---------------------------------------------------------------------------------------------

VLLM_FLA_MODULES = ("vllm.third_party.flash_linear_attention.ops",  # vLLM 0.26
                    "vllm.model_executor.layers.fla.ops")            # older vLLM


def load_vllm():
    """vLLM's Triton chunk_gated_delta_rule and its module, or (None, reason)."""
    errs = []
    for mod in VLLM_FLA_MODULES:
        try:
            m = importlib.import_module(mod)
            fn = m.chunk_gated_delta_rule
        except Exception as e:  # noqa: BLE001 - optional
            errs.append(f"{mod}: {err_text(e, 150)}")
            continue
        try:
            import vllm
            ver = getattr(vllm, "__version__", "?")
        except Exception:  # noqa: BLE001
            ver = "?"
        return dict(fn=fn, module=mod, version=ver), None
    return None, "; ".join(errs)


def bench_vllm(torch, triton, vl, case, quick, ref):
    import torch.nn.functional as F
    fn, T = vl["fn"], case.T
    q = case.q.contiguous().unsqueeze(0)
    k = case.k.contiguous().unsqueeze(0)
    v = case.v.contiguous().unsqueeze(0)
    g = (-torch.exp(case.A_log) * F.softplus(case.a.float() + case.dt_bias)).unsqueeze(0)
    beta = torch.sigmoid(case.b.float()).to(case.b.dtype).unsqueeze(0)
    cu = torch.arange(0, T + 1, case.L, device=DEVICE, dtype=torch.int32)
    h0 = torch.zeros(case.nseq, case.HV, V, K, device=DEVICE)  # vLLM passes the gathered states
    kw = dict(scale=K ** -0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
              use_qk_l2norm_in_kernel=True)
    params = inspect.signature(fn).parameters
    notes = []
    if "chunk_indices" in params:  # vLLM builds these once per step in its attention metadata
        try:
            idx = importlib.import_module(vl["module"] + ".index")
            kw["chunk_indices"] = idx.prepare_chunk_indices(cu, 64)
            if "chunk_offsets" in params:
                kw["chunk_offsets"] = idx.prepare_chunk_offsets(cu, 64)
        except Exception as e:  # noqa: BLE001 - then the function builds them itself
            notes.append(f"chunk indices not precomputed: {err_text(e, 120)}")

    def call():
        return fn(q, k, v, g, beta, **kw)

    t_first, _ = first_call_s(torch, call)
    for _ in range(2):  # its autotuner runs on the first calls
        call()
    ms = bench_ms(triton, call, quick)
    o, ht = call()
    res = dict(ms=ms, Mtok_s=mtok(T, ms), first_call_s=t_first, notes=notes,
               rel_diff_out=rel(o[0], ref["out"]))
    res.update(state_diffs(ht, ref["state"]))
    return res


# ---------------------------------------------------------------------------------------------
# FlashInfer
# ---------------------------------------------------------------------------------------------

def load_fi():
    """FlashInfer's GDN prefill (and its version), or (None, reason)."""
    try:
        import flashinfer
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - optional
        return None, err_text(e)
    return dict(prefill=chunk_gated_delta_rule, version=getattr(flashinfer, "__version__", "?")), None


@functools.lru_cache(maxsize=None)
def _scatter_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def scatter_states(src, dst, src_idx, dst_idx, N_ELEM: tl.constexpr, BLOCK: tl.constexpr):
        """dst[dst_idx[i]] = src[src_idx[i]] for whole states of N_ELEM elements (contiguous)."""
        i, j = tl.program_id(0), tl.program_id(1)
        s = tl.load(src_idx + i).to(tl.int64)
        d = tl.load(dst_idx + i).to(tl.int64)
        o = j * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + d * N_ELEM + o, tl.load(src + s * N_ELEM + o))

    return scatter_states


def scatter_states(src, dst, src_idx, dst_idx):
    """Copy whole states src[src_idx[i]] -> dst[dst_idx[i]] (both [n, HV, V, K] contiguous): one
    read and one write per state, the cheapest way to land FlashInfer's checkpoints in slots."""
    n = src_idx.numel()
    if n == 0:
        return
    n_elem = src[0].numel()
    block = min(4096, n_elem)
    assert n_elem % block == 0 and src.is_contiguous() and dst.is_contiguous()
    _scatter_kernel()[(n, n_elem // block)](src, dst, src_idx, dst_idx, N_ELEM=n_elem, BLOCK=block,
                                             num_warps=4)


class FiInputs:
    """FlashInfer's inputs for one case: q, k l2-normalised (its SM90 kernel does not normalise:
    use_qk_l2norm_in_kernel is not passed on), v contiguous, alpha = exp(g) and beta = sigmoid(b)
    in fp32 [T, HV], cu_seqlens int64; preallocated out, final states and checkpoints."""

    def __init__(self, torch, case):
        self.torch, self.case = torch, case
        self.prep()
        T, nseq = case.T, case.nseq
        self.cu = torch.arange(0, T + 1, case.L, device=DEVICE, dtype=torch.int64)
        self.out = torch.empty(T, case.HV, V, device=DEVICE, dtype=torch.bfloat16)
        self.state = torch.empty(nseq, case.HV, V, K, device=DEVICE)
        self.ckpt = {}
        for name, B in MODES[1:]:
            per = case.L // B  # FlashInfer stores seq_len // B checkpoints per sequence
            self.ckpt[name] = dict(
                per=per,
                states=torch.empty(max(1, nseq * per), case.HV, V, K, device=DEVICE),
                cu=torch.arange(0, nseq * per + 1, max(per, 1), device=DEVICE,
                                dtype=torch.int64)[:nseq + 1] if per else
                torch.zeros(nseq + 1, device=DEVICE, dtype=torch.int64))
            # ours' checkpoint slots, in order, and where FlashInfer put the same states: ours
            # stores the boundaries strictly inside a span, FlashInfer every multiple of B up to
            # the end (the last equals the final state when B divides the length)
            writes, ckpts = case.slots[name]
            src = [i * per + e for i, row in enumerate(ckpts) for e in range(len(row))]
            dst = [s for row in ckpts for s in row]
            self.ckpt[name].update(
                src=torch.tensor(src, device=DEVICE, dtype=torch.int32),
                dst=torch.tensor(dst, device=DEVICE, dtype=torch.int32))
        self.seq_idx = torch.arange(nseq, device=DEVICE, dtype=torch.int32)
        self.write_idx = torch.tensor(case.slots["off"][0], device=DEVICE, dtype=torch.int32)

    def prep(self):
        """What a caller does before FlashInfer's kernel (vLLM: l2norm_fwd, exp, .contiguous())."""
        torch, c = self.torch, self.case
        import torch.nn.functional as F

        def l2n(x):
            x = x.float()
            return (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)

        self.q = l2n(c.q).contiguous()
        self.k = l2n(c.k).contiguous()
        self.v = c.v.contiguous()
        self.alpha = torch.exp(-torch.exp(c.A_log) * F.softplus(c.a.float() + c.dt_bias)).contiguous()
        self.beta = torch.sigmoid(c.b.float()).contiguous()


def fi_call(fi, x, mode=None, use_cp="auto"):
    """One FlashInfer prefill on FiInputs x; mode None: no checkpoints, else MODES' name."""
    kw = dict(g=x.alpha, beta=x.beta, scale=K ** -0.5, initial_state=None,
              output_final_state=True, cu_seqlens=x.cu, output=x.out, output_state=x.state)
    if mode is not None:
        ck = x.ckpt[mode]
        kw.update(state_checkpoints=ck["states"], checkpoint_cu_starts=ck["cu"],
                  checkpoint_every_n_tokens=dict(MODES)[mode])
    if fi.get("has_use_cp", True):
        kw["use_cp"] = use_cp
    return fi["prefill"](x.q, x.k, x.v, **kw)


def fi_cp_auto(torch, nseq, hv):
    """Whether FlashInfer's use_cp="auto" routes a checkpoint-free call to its CP kernel (its
    heuristic in gdn_prefill.py: SM90 and num_seqs * num_heads < SMs / 2)."""
    if DEVICE != "cuda":
        return False
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major == 9 and nseq * hv < max(1, props.multi_processor_count // 2)


def bench_fi(torch, triton, fi, case, quick, ref):
    """FlashInfer's columns for one case (each caught on its own: its error lands in its row)."""
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    T = case.T
    fi = dict(fi, has_use_cp="use_cp" in inspect.signature(fi["prefill"]).parameters)
    x = FiInputs(torch, case)
    res = dict(cp_auto=fi_cp_auto(torch, case.nseq, case.HV))
    try:
        res["prep_ms"] = bench_ms(triton, x.prep, quick)
    except Exception as e:  # noqa: BLE001
        res["prep_error"] = err_text(e)

    def column(key, fn):
        try:
            t_first, _ = first_call_s(torch, fn)
            ms = bench_ms(triton, fn, quick)
            res[key] = dict(ms=ms, Mtok_s=mtok(T, ms), first_call_s=t_first)
        except Exception as e:  # noqa: BLE001 - e.g. a CuTe-DSL compile or argument error
            res[key] = dict(error=err_text(e))
        return "error" not in res[key]

    if column("off", lambda: fi_call(fi, x)):
        fi_call(fi, x)
        r = res["off"]
        r["path"] = "cp" if res["cp_auto"] else "non-cp"
        r["rel_diff_out"] = rel(x.out, ref["out"])
        r.update(state_diffs(x.state, ref["state"]))
        if "prep_ms" in res:
            r["Mtok_s_incl_prep"] = mtok(T, r["ms"] + res["prep_ms"])
    if res["cp_auto"] and fi["has_use_cp"] and column("off_nocp", lambda: fi_call(fi, x, use_cp=False)):
        fi_call(fi, x, use_cp=False)
        r = res["off_nocp"]
        r["path"] = "non-cp"
        r["rel_diff_out"] = rel(x.out, ref["out"])
        r.update(state_diffs(x.state, ref["state"]))
    # FlashInfer's non-CP kernels replayed from a CUDA graph: their GPU time, which the eager
    # figures hide under ~0.2 ms of host time a call at several sequences
    for key, mode in (("off_nocp" if "off_nocp" in res else "off", None), ("ckpt B=256", "B=256")):
        res[f"graph {key}"] = graph_ms(torch, triton, lambda mode=mode: fi_call(fi, x, mode, use_cp=False), quick)
    pool = torch.zeros_like(case.pool)
    for name, _ in MODES[1:]:
        ck = x.ckpt[name]
        ok = column(f"ckpt {name}", lambda name=name: fi_call(fi, x, name, use_cp=False))
        if ok:
            res[f"ckpt {name}"]["checkpoints"] = int(ck["states"].shape[0]) if ck["per"] else 0
            # against the same (non-CP) kernel without checkpoints
            base = res.get("off_nocp") if "ms" in res.get("off_nocp", {}) else res.get("off", {})
            if "ms" in base:
                res[f"ckpt {name}"]["ckpt_cost_pct"] = 100.0 * (res[f"ckpt {name}"]["ms"] / base["ms"] - 1)

        def to_pool(name=name, ck=ck):
            fi_call(fi, x, name, use_cp=False)
            scatter_states(ck["states"], pool, ck["src"], ck["dst"])
            scatter_states(x.state, pool, x.seq_idx, x.write_idx)

        if not ok:
            res[f"pool {name}"] = dict(error="not run (its checkpoint column failed)")
            continue
        if column(f"pool {name}", to_pool):
            r = res[f"pool {name}"]
            r["slots_written"] = int(ck["dst"].numel() + x.write_idx.numel())
            try:
                r["ms_scatter"] = bench_ms(triton, lambda ck=ck: (
                    scatter_states(ck["states"], pool, ck["src"], ck["dst"]),
                    scatter_states(x.state, pool, x.seq_idx, x.write_idx)), quick)
                pool.zero_()
                to_pool()
                # ours into the same slots of its own pool, then compare slot by slot
                gdn_chunk_prefill(*case.args(), case.metas[name], out=case.out, workspace=case.ws)
                idx = torch.cat([ck["dst"], x.write_idx]).long()
                r.update({k.replace("state", "pool"): d for k, d in
                          state_diffs(pool.index_select(0, idx), case.pool.index_select(0, idx)).items()})
                r["rel_diff_out"] = rel(x.out, case.out)
            except Exception as e:  # noqa: BLE001
                r["check_error"] = err_text(e)
    del pool
    bench_via_fi(torch, triton, fi, case, quick, res)
    off = res.get("off", {}).get("ms")
    for key, r in res.items():  # every FlashInfer column against FlashInfer without checkpoints
        if off and isinstance(r, dict) and "ms" in r:
            r["vs_fi_off"] = off / r["ms"]
    del x
    return res


def bench_via_fi(torch, triton, fi, case, quick, res):
    """Columns "via B=...": ours on FlashInfer's kernel (gdn_graphs.ops.fi_prefill.gdn_fi_prefill:
    fused prep + slot gather + FlashInfer with checkpoints + scatter into the pool slots that ours
    writes), everything timed, persistent out and workspace; its outputs and slots vs ours."""
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    from gdn_graphs.ops.fi_prefill import FiWorkspace, gdn_fi_prefill
    T = case.T
    try:
        ws = FiWorkspace(T, case.nseq, case.HK, case.HV, K, V, torch.bfloat16, DEVICE,
                         max_checkpoints=T // CHUNK_TOKENS)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory
        res["via B=256"] = dict(error=err_text(e))
        return
    out = torch.empty(T, case.HV, V, device=DEVICE, dtype=torch.bfloat16)
    pool = torch.zeros_like(case.pool)
    res["via_workspace_MiB"] = ws.nbytes() / MiB
    # every = B (all starts block-aligned), and for the first mode also every = 64: what a step
    # pays when one of its prefill rows starts mid-block (FlashInfer stores a state every 64
    # tokens, the scatter keeps the block boundaries). First eagerly, then with fi_capture's
    # graphs of FlashInfer's call (as the vLLM plugin runs it), the same calls again
    calls = [(m, None) for m, _ in MODES[1:]] + [(MODES[1][0], CHUNK_TOKENS)]
    eager_out = {}
    for graphs in (False, True):
        if graphs:
            from gdn_graphs.ops.fi_prefill import fi_capture
            try:
                t0 = time.perf_counter()
                res["via_graphs_made"] = sum(fi_capture(ws, B, fi_fn=fi["prefill"]) for _, B in MODES[1:])
                res["via_capture_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                res["via_capture_error"] = err_text(e)
                break
        for name, every in calls:
            meta = case.metas[name]

            def call(meta=meta, every=every):
                return gdn_fi_prefill(*case.args()[:7], pool, meta, out, ws, fi_fn=fi["prefill"],
                                      every=every)

            key = f"via {name}" + ("" if every is None else f" e{every}") + (" graph" if graphs else "")
            try:
                n0 = dict(ws.calls)
                t_first, _ = first_call_s(torch, call)
                ms = bench_ms(triton, call, quick)
                res[key] = r = dict(ms=ms, Mtok_s=mtok(T, ms), first_call_s=t_first,
                                    calls={k: ws.calls[k] - n0[k] for k in n0})
            except Exception as e:  # noqa: BLE001
                res[key] = dict(error=err_text(e))
                continue
            try:
                pool.zero_()
                call()
                if graphs and key[:-len(" graph")] in eager_out:
                    r["same_bits_as_eager"] = bool(torch.equal(out, eager_out[key[:-len(" graph")]]))
                elif not graphs:
                    eager_out[key] = out.clone()
                gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws)
                writes, ckpts = case.slots[name]
                idx = torch.tensor(writes + [s for row in ckpts for s in row], device=DEVICE, dtype=torch.long)
                r["slots_written"] = int(idx.numel())
                r["rel_diff_out"] = rel(out, case.out)
                r.update({k.replace("state", "pool"): d for k, d in
                          state_diffs(pool.index_select(0, idx), case.pool.index_select(0, idx)).items()})
            except Exception as e:  # noqa: BLE001
                r["check_error"] = err_text(e)
    del ws, out, pool


# ---------------------------------------------------------------------------------------------
# vLLM's default GDN prefill on SM90: its prep, gather, FlashInfer wrapper, scatter
# ---------------------------------------------------------------------------------------------

def load_vllm_fi():
    """vLLM 0.26's fused_post_conv_prep and fi_chunk_gated_delta_rule, with FlashInfer importable
    (the wrapper imports it on each call), or (None, reason)."""
    try:
        import vllm
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import fi_chunk_gated_delta_rule
        from vllm.third_party.flash_linear_attention.ops import fused_post_conv_prep
    except Exception as e:  # noqa: BLE001 - optional
        return None, f"vLLM: {err_text(e, 200)}"
    fi, err = load_fi()
    if fi is None:
        return None, f"FlashInfer: {err}"
    return dict(prep=fused_post_conv_prep, fn=fi_chunk_gated_delta_rule,
                version=getattr(vllm, "__version__", "?"), fi_version=fi["version"]), None


def bench_vllm_fi(torch, triton, vf, case, quick, ref):
    """vLLM's GatedDeltaNetAttention._forward_core for an all-prefill batch (no spec decode),
    FlashInfer backend, timed as one call; a persistent pool as vLLM's ssm_state."""
    T = case.T
    pools = {"fp32": torch.zeros_like(case.pool)}  # ssm_state: [slots, HV, V, K], as vLLM lays it out
    pool = pools["fp32"]
    state_idx = torch.tensor(case.slots["off"][0], device=DEVICE, dtype=torch.int32)
    has_initial = torch.zeros(case.nseq, device=DEVICE, dtype=torch.bool)  # every sequence fresh
    cu = torch.arange(0, T + 1, case.L, device=DEVICE, dtype=torch.int32)  # query_start_loc

    def call(graph_safe=False, pool_dtype="fp32"):
        pool = pools[pool_dtype]
        q, k, v, g, beta = vf["prep"](
            conv_output=case.qkv, a=case.a, b=case.b, A_log=case.A_log, dt_bias=case.dt_bias,
            num_k_heads=case.HK, head_k_dim=K, head_v_dim=V, apply_l2norm=True, output_g_exp=False)
        initial_state = pool[state_idx]
        if graph_safe:  # the same zeros without the boolean index's sync (which a capture refuses)
            initial_state.mul_(has_initial.view(-1, 1, 1, 1))
        else:
            initial_state[~has_initial, ...] = 0
        o, last_state = vf["fn"](
            q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=g.unsqueeze(0),
            beta=beta.unsqueeze(0), initial_state=initial_state, output_final_state=True,
            cu_seqlens=cu, use_qk_l2norm_in_kernel=False)
        pool[state_idx] = last_state.to(pool.dtype)
        return o

    t_first, _ = first_call_s(torch, call)
    ms = bench_ms(triton, call, quick)
    pool.zero_()
    o = call()
    res = dict(ms=ms, Mtok_s=mtok(T, ms), first_call_s=t_first, rel_diff_out=rel(o[0], ref["out"]),
               peak_extra_MiB=peak_extra_mib(torch, call))
    # its GPU work alone, replayed from a CUDA graph: what it costs where the host runs ahead (in a
    # model whose other layers keep the GPU busy, vLLM's eager host work hides behind them)
    res["ms_graph"] = graph_ms(torch, triton, lambda: call(graph_safe=True), quick)
    # with a bf16 pool (vLLM's default for a bf16 model: its wrapper casts the states to fp32 and back)
    pools["bf16"] = torch.zeros(pool.shape, device=pool.device, dtype=torch.bfloat16)
    res["ms_graph_bf16_pool"] = graph_ms(torch, triton, lambda: call(graph_safe=True, pool_dtype="bf16"), quick)
    del pools["bf16"]
    res.update(state_diffs(pool.index_select(0, state_idx.long()), ref["state"]))
    return res


# ---------------------------------------------------------------------------------------------
# knob sweep
# ---------------------------------------------------------------------------------------------

def sweep_worker(torch, triton, start, quick, jsonl: Path, shape):
    """Time and check the knob configs from index ``start`` on (``shape``, B = 256), one JSON line
    each.

    Runs in a child process: a config that crashes the CUDA context (an illegal access would poison
    every later launch) then costs only its own line; the parent restarts after it. Each config's
    output is compared with the default config's (a miscompiled config must not win the sweep)."""
    from gdn_graphs.ops.chunk import DEFAULT_CONFIG, ChunkConfig, gdn_chunk_prefill

    case = Case(torch, *shape)
    meta = case.metas["B=256"]
    gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=DEFAULT_CONFIG)
    ref = case.out.float().clone()
    knobs_all = SWEEP_QUICK if quick else SWEEP
    for i in range(start, len(knobs_all)):
        knobs = knobs_all[i]
        row = dict(knobs, index=i)
        try:
            cfg = ChunkConfig(**knobs)
            case.out.fill_(float("nan"))
            gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)
            torch.cuda.synchronize() if DEVICE == "cuda" else None
            row["rel_diff_vs_default"] = float((case.out.float() - ref).norm() / ref.norm())
            ms = bench_ms(triton, lambda: gdn_chunk_prefill(*case.args(), meta, out=case.out,
                                                            workspace=case.ws, config=cfg), quick)
            row.update(ms=ms, Mtok_s=mtok(case.T, ms))
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
            row["error"] = f"{e.__class__.__name__}: {str(e)[:200]}"
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if "CUDA error" in row.get("error", ""):
            sys.exit(3)  # the context is dead: the parent restarts after this config


def sweep(args, shape):
    """Run sweep_worker in child processes until every config has a line; returns the rows.
    ``shape``: the first of --shapes (default 1x8192; 8x2048 for a batch of several sequences)."""
    jsonl = args.out / "bench_prefill_sweep.jsonl"
    jsonl.unlink(missing_ok=True)
    n = len(SWEEP_QUICK if args.quick else SWEEP)
    start = 0
    while start < n:
        cmd = [sys.executable, __file__, "--out", str(args.out), "--sweep-worker", str(start),
               "--shapes", f"{shape[0]}x{shape[1]}"]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--cpu-dry-run"] if args.cpu_dry_run else []
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
        done = len(rows)
        if done < n and proc.returncode not in (0, 3):  # config `done` killed the worker: record it
            knobs = (SWEEP_QUICK if args.quick else SWEEP)[done]
            err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            with jsonl.open("a") as f:
                f.write(json.dumps(dict(knobs, index=done, error=f"worker died: {err}")) + "\n")
            done += 1
        if done <= start:
            break
        start = done
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return dict(shape=f"{shape[0]}x{shape[1]}", mode="B=256", seq=rows)


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------

def _get(entry, *path):
    """entry[path...]['Mtok_s'] or 0.0 where absent or failed."""
    for p in path:
        entry = (entry or {}).get(p) or {}
    return entry.get("Mtok_s", 0.0) if isinstance(entry, dict) else 0.0


def plot_series(results):
    """(label, f(shape entry) -> M tok/s) for every column present in the results."""
    entries = list(results["shapes"].values())
    series = [(f"ours, ckpt {m}", lambda e, m=m: _get(e, "ours", m)) for m, _ in MODES]
    series = [s for s in series if any(s[1](e) for e in entries)]
    extra = [("fla chunk_gated_delta_rule (no ckpt)", lambda e: _get(e, "fla")),
             ("vLLM Triton (no ckpt)", lambda e: _get(e, "vllm")),
             ("FlashInfer, no ckpt (auto)", lambda e: _get(e, "fi", "off")),
             (f"FlashInfer, own ckpt {MODES[1][0]}", lambda e: _get(e, "fi", f"ckpt {MODES[1][0]}")),
             (f"FlashInfer + scatter to slots, {MODES[1][0]}", lambda e: _get(e, "fi", f"pool {MODES[1][0]}")),
             (f"ours via FlashInfer, {MODES[1][0]}", lambda e: _get(e, "fi", f"via {MODES[1][0]}")),
             (f"ours via FlashInfer, {MODES[2][0]}", lambda e: _get(e, "fi", f"via {MODES[2][0]}")),
             ("vLLM default (FlashInfer, no ckpt)", lambda e: _get(e, "vllm_fi"))]
    return series + [s for s in extra if any(s[1](e) for e in entries)]


def plot(path, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - optional
        return False
    shapes = list(results["shapes"])
    series = plot_series(results)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw=dict(width_ratios=[1.8, 1]))
    ax = axes[0]
    w = 0.8 / max(1, len(series))
    for i, (label, f) in enumerate(series):
        xs = [j + i * w for j in range(len(shapes))]
        ax.bar(xs, [f(results["shapes"][s]) for s in shapes], w, label=label)
    ax.axhline(16, color="k", ls="--", lw=0.8, label="goal 16 M tok/s")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))])
    ax.set_xticklabels(shapes, fontsize=8)
    ax.set_ylabel("M tokens/s per layer")
    ax.set_title(f"GDN chunked prefill, K = V = {K}, bf16 ({results['device']}); "
                 f"tp1: HV 32, tp2: HV 16", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[1]
    rows = [r for r in results.get("sweep", {}).get("seq", []) if "Mtok_s" in r]
    ax.bar(range(len(rows)), [r["Mtok_s"] for r in rows])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"bv{r['bv']} w{r['warps_seq']} s{r['stages']}" for r in rows], rotation=70, fontsize=7)
    ax.set_ylabel(f"M tokens/s ({results.get('sweep', {}).get('shape')}, B = 256)")
    ax.set_title("launch-knob sweep", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _fmt_diffs(r, keys=(("out", "rel_diff_out"), ("state", "rel_diff_state"),
                        ("state^T", "rel_diff_state_T"), ("pool", "rel_diff_pool"),
                        ("pool^T", "rel_diff_pool_T"))):
    parts = [f"{label} {r[key]:.1e}" for label, key in keys if isinstance(r.get(key), float)]
    return ("rel diff to ours: " + ", ".join(parts)) if parts else ""


def format_row(shape, label, r, ours_ms=None):
    """One table row: shape, label, ms, M tok/s, speed relative to ours (no checkpoints), notes;
    a failed column prints its error instead."""
    if not r:
        return f"{shape:>12} {label:>16} n/a"
    if "ms" not in r:
        return f"{shape:>12} {label:>16} failed: {r.get('error', '?')}"
    vs = f"{ours_ms / r['ms']:6.2f}x" if ours_ms else f"{'':>7}"
    notes = [n for n in (
        f"first call {r['first_call_s']:.1f} s" if "first_call_s" in r else "",
        f"path {r['path']}" if "path" in r else "",
        f"ckpt cost {r['ckpt_cost_pct']:+.1f}%" if "ckpt_cost_pct" in r else "",
        f"scatter {r['ms_scatter']:.3f} ms" if "ms_scatter" in r else "",
        f"incl. prep {r['Mtok_s_incl_prep']:.2f} Mtok/s" if "Mtok_s_incl_prep" in r else "",
        _fmt_diffs(r), r.get("check_error", "")) if n]
    return f"{shape:>12} {label:>16} {r['ms']:8.3f} {r['Mtok_s']:8.2f} {vs}  " + "; ".join(notes)


def via_fi_keys():
    keys = [f"via {m}" for m, _ in MODES[1:]] + [f"via {MODES[1][0]} e{CHUNK_TOKENS}"]
    return keys + [k + " graph" for k in keys]


def via_fi_label(key):
    return key.replace("via", "via FI").replace(f" e{CHUNK_TOKENS}", " every 64")


def ratios_vs_fi_off(ours, fi, vllm_fi=None):
    """Speed of each column relative to FlashInfer without checkpoints (> 1: faster than it)."""
    off = fi.get("off", {}).get("ms")
    if not off:
        return "n/a (FI off failed)"
    cols = [(f"ours {m}", ours.get(m)) for m, _ in MODES[1:]]
    cols += [(f"FI ckpt {m}", fi.get(f"ckpt {m}")) for m, _ in MODES[1:]]
    cols += [(via_fi_label(key), fi.get(key)) for key in via_fi_keys()]
    cols += [("vLLM default (FI)", vllm_fi)]
    return ", ".join(f"{label} {off / r['ms']:.2f}x" for label, r in cols if r and "ms" in r)


def graph_ratios(ours, fi, vllm_fi=None):
    """ours B=256, FlashInfer's non-CP kernels (no states; its checkpoints every 256) and vLLM's
    default sequence (prep, gather, FlashInfer, scatter), each replayed from a CUDA graph: ms and
    ours' speed relative to each (> 1: ours faster)."""
    o = (ours.get("B=256") or {}).get("ms_graph")
    off = next((fi[k] for k in ("graph off_nocp", "graph off") if fi.get(k)), None)
    ck = fi.get("graph ckpt B=256")
    vd = (vllm_fi or {}).get("ms_graph")
    if not (o and off):
        return ""
    return (f"ours B=256 {o:.3f} ms, FI no states {off:.3f}, FI ckpt B=256 "
            + (f"{ck:.3f}" if ck else "n/a") + (f", vLLM default {vd:.3f}" if vd else "")
            + f"; ours / FI no states {off / o:.2f}x"
            + (f", ours / FI ckpt {ck / o:.2f}x" if ck else "")
            + (f", ours / vLLM default {vd / o:.2f}x" if vd else ""))


def graph_ratio_bf16_pool(ours, vllm_fi):
    """ours B=256 and vLLM's default sequence, both with a bf16 pool, replayed from CUDA graphs."""
    o = (ours.get("B=256") or {}).get("ms_graph_bf16_pool")
    vd = (vllm_fi or {}).get("ms_graph_bf16_pool")
    if not (o and vd):
        return ""
    return f"ours B=256 {o:.3f} ms, vLLM default {vd:.3f}; ours / vLLM default {vd / o:.2f}x"


def ratios_via_fi_vs_vllm_fi(fi, vllm_fi):
    """Speed of ours via FlashInfer (checkpoints included) relative to vLLM's default (> 1: faster)."""
    base = (vllm_fi or {}).get("ms")
    cols = [(via_fi_label(key), (fi or {}).get(key)) for key in via_fi_keys()]
    return ", ".join(f"{label} {base / r['ms']:.2f}x" for label, r in cols if base and r and "ms" in r)


def print_table(results, sweep_only=False):
    if sweep_only:
        return _print_sweep(results)
    print()
    print(f"GDN chunked prefill, K = V = {K}, bf16 inputs, fp32 pool -- {results['device']}")
    print("ours' detail (intra / seq: each kernel alone)")
    hdr = (f"{'shape':>12} {'mode':>7} {'ms':>8} {'Mtok/s':>8} {'intra ms':>9} {'(Triton)':>9} {'seq ms':>8} "
           f"{'ckpts':>6} {'ckpt cost':>9}")
    print(hdr)
    print("-" * len(hdr))
    for shape, r in results["shapes"].items():
        for m, _ in MODES:
            o = r.get("ours", {}).get(m)
            if not o:
                continue
            cost = f"{o['ckpt_cost_pct']:+8.2f}%" if "ckpt_cost_pct" in o else ""
            print(f"{shape:>12} {m:>7} {o['ms']:8.3f} {o['Mtok_s']:8.2f} {o['ms_intra']:9.3f} "
                  f"{o.get('ms_intra_triton', o['ms_intra']):9.3f} {o['ms_seq']:8.3f} "
                  f"{o['checkpoints']:6d} {cost:>9}")
        if "peak_extra_MiB" in r.get("ours", {}):
            print(f"{shape:>12} ours peak extra memory per call {r['ours']['peak_extra_MiB']:.0f} MiB "
                  f"(workspace {r['ours']['workspace_MiB']:.0f} MiB)"
                  + (" knobs {seq_kernel} bv {bv} / {warps_seq} warps / {stages} stages, intra {intra_kernel}".format(
                      **{"intra_kernel": "triton", **r["ours"]["config"]})
                     if "config" in r["ours"] else ""))
    print("\nside by side (vs ours: ours' time at the same checkpoint mode / this column's, > 1: "
          "faster than ours; the no-checkpoint columns against ours off)")
    hdr = f"{'shape':>12} {'column':>16} {'ms':>8} {'Mtok/s':>8} {'vs ours':>7}  notes"
    print(hdr)
    print("-" * 100)
    for shape, r in results["shapes"].items():
        if "error" in r:
            print(f"{shape:>12} failed: {r['error']}")
            continue
        ours = r.get("ours", {})

        def ours_ms(key):
            mode = key.split()[-1]
            return ours.get(mode if mode in dict(MODES) else "off", {}).get("ms")

        for m, _ in MODES:
            if m in ours:
                print(format_row(shape, f"ours {m}", ours[m], ours_ms("off")))
        for col, label in (("fla", "fla"), ("vllm", "vLLM Triton")):
            if col in r:
                print(format_row(shape, label, r[col], ours_ms("off")))
        fi = r.get("fi")
        if fi and "error" in fi:
            print(format_row(shape, "FlashInfer", fi))
        elif fi:
            prep = f"{fi['prep_ms']:.3f} ms" if "prep_ms" in fi else fi.get("prep_error", "?")
            keys = ["off", "off_nocp"] + [f"{kind} {m}" for m, _ in MODES[1:] for kind in ("ckpt", "pool")]
            for key in keys:
                if key in fi:
                    print(format_row(shape, f"FI {key}", fi[key], ours_ms(key)))
            for key in via_fi_keys():
                if key in fi:
                    print(format_row(shape, f"ours {key.replace('via', 'via FI')}", fi[key],
                                     ours_ms(key.split()[1])))
            print(f"{shape:>12} {'FI prep':>16} {prep} (l2norm q, k; exp(g), sigmoid(b) in fp32; "
                  f"not in the FI rows; in the 'ours via FI' rows, fused)")
        if "vllm_fi" in r:
            print(format_row(shape, "vLLM default (FI)", r["vllm_fi"], ours_ms("off")))
        if fi and "error" not in fi:
            print(f"{shape:>12} {'vs FI off':>16} " + ratios_vs_fi_off(ours, fi, r.get("vllm_fi")))
            line = graph_ratios(ours, fi, r.get("vllm_fi"))
            if line:
                print(f"{shape:>12} {'CUDA graphs':>16} " + line)
        line = graph_ratio_bf16_pool(ours, r.get("vllm_fi"))
        if line:
            print(f"{shape:>12} {'graphs bf16 pool':>16} " + line)
        line = ratios_via_fi_vs_vllm_fi(fi, r.get("vllm_fi"))
        if line:
            print(f"{shape:>12} ours via FI / vLLM default (FI): {line}")
    for col in ("fla", "vllm", "fi", "vllm_fi"):
        if results.get(f"{col}_error"):
            print(f"{col}: not compared: {results[f'{col}_error']}")
    _print_sweep(results)


def _print_sweep(results):
    sw = results.get("sweep")
    if not sw:
        return
    print(f"\nknob sweep, {sw['shape']} B=256 (best first; rel diff of out vs the default config):")
    for r in sorted(sw["seq"], key=lambda r: r.get("ms", 1e9))[:8]:
        print(f"  bv {r['bv']:3d} warps_intra {r.get('warps_intra', '-')} warps_seq {r['warps_seq']} "
              f"stages {r['stages']}: " + (f"{r['ms']:.3f} ms {r['Mtok_s']:.2f} Mtok/s "
                                          f"(diff {r['rel_diff_vs_default']:.1e})" if "ms" in r else r["error"]))


def _dry_run_setup():
    """Tiny shapes on the CPU under the Triton interpreter: exercises every code path of this
    script except the GPU timers, the memory counters and fla/vLLM/FlashInfer (a test may hand in
    stand-ins for those through load_fla / load_vllm / load_fi)."""
    import os
    global DEVICE, HK, HV, K, V, SHAPES, MODES, SWEEP, SWEEP_QUICK, TP_HEADS
    os.environ["TRITON_INTERPRET"] = "1"
    DEVICE = "cpu"
    TP_HEADS = {1: (1, 2), 2: (1, 1)}
    HK, HV, K, V = 1, 2, 32, 32
    SHAPES = [(1, 192), (2, 64), (1, 256)]
    MODES = [("off", None), ("B=256", 64), ("B=1024", 128)]
    SWEEP = SWEEP_QUICK = [dict(bv=16, warps_seq=4, stages=2), dict(bv=32, warps_seq=4, stages=3)]


def _load_optional(args, name, loader):
    if name not in args.only:
        flags = "--no-vllm / --no-fi" if name == "vllm_fi" else "--no-" + name
        return None, f"skipped (not in --only / {flags})"
    if args.cpu_dry_run and not getattr(loader, "dry_run_ok", False):
        return None, "skipped (--cpu-dry-run)"
    return loader()


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_dry_run:
        _dry_run_setup()
    shapes = args.shapes or SHAPES
    import torch
    import triton

    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_prefill needs a CUDA GPU (or --cpu-dry-run)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sweep_worker is not None:
        torch.set_grad_enabled(False)
        return sweep_worker(torch, triton, args.sweep_worker, args.quick,
                            args.out / "bench_prefill_sweep.jsonl", shapes[0])
    if args.sweep_only:
        sw = sweep(args, shapes[0])
        (args.out / "bench_prefill_sweep.json").write_text(json.dumps(sw, indent=1))
        return print_table(dict(shapes={}, sweep=sw, device="", fla_error=None), sweep_only=True)
    from gdn_graphs.ops.chunk import DEFAULT_CONFIG
    results = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"), commit=git_commit(),
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
        torch=torch.__version__, triton=triton.__version__,
        dims=dict(K=K, V=V, dtype="bfloat16", pool="float32",
                  heads={f"tp{tp}": dict(HK=TP_HEADS[tp][0], HV=TP_HEADS[tp][1]) for tp in args.tp}),
        default_config=DEFAULT_CONFIG.__dict__, quick=args.quick, tp=args.tp, only=args.only,
        argv=sys.argv[1:] if argv is None else list(argv), shapes={},
    )
    fla_fn, results["fla_error"] = _load_optional(args, "fla", load_fla)
    if fla_fn is not None:
        try:
            import fla
            results["fla_version"] = getattr(fla, "__version__", "?")
        except Exception:  # noqa: BLE001
            pass
    vl, results["vllm_error"] = _load_optional(args, "vllm", load_vllm)
    if vl is not None:
        results["vllm_version"], results["vllm_module"] = vl["version"], vl["module"]
    fi, results["fi_error"] = _load_optional(args, "fi", load_fi)
    if fi is not None:
        results["fi_version"] = fi["version"]
    vf, results["vllm_fi_error"] = _load_optional(args, "vllm_fi", load_vllm_fi)
    if vf is not None:
        results["vllm_fi_versions"] = dict(vllm=vf["version"], flashinfer=vf["fi_version"])
    log("columns: " + ", ".join(f"{c}: {'yes' if ok else results.get(c + '_error')}" for c, ok in
                                (("ours", "ours" in args.only), ("fla", fla_fn), ("vllm", vl), ("fi", fi),
                                 ("vllm_fi", vf))))
    torch.set_grad_enabled(False)
    json_path = args.out / "bench_prefill.json"
    for tp in args.tp:
        set_tp(tp)
        for nseq, L in shapes:
            name = shape_name(nseq, L, tp)
            entry = dict(tp=tp, HK=HK, HV=HV, nseq=nseq, L=L)
            try:
                case = Case(torch, nseq, L)
                ref = ours_reference(torch, case)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: the next shape may fit
                entry["error"] = err_text(e)
                results["shapes"][name] = entry
                log(f"{name}: setup failed: {entry['error']}")
                continue
            if "ours" in args.only:
                log(f"{name}: ours")
                entry["ours"] = bench_ours(torch, triton, case, args.quick)
            for col, ok, fn in (("fla", fla_fn, lambda: bench_fla(torch, triton, fla_fn, case, args.quick)),
                                ("vllm", vl, lambda: bench_vllm(torch, triton, vl, case, args.quick, ref)),
                                ("fi", fi, lambda: bench_fi(torch, triton, fi, case, args.quick, ref)),
                                ("vllm_fi", vf, lambda: bench_vllm_fi(torch, triton, vf, case, args.quick, ref))):
                if ok is None:
                    continue
                log(f"{name}: {col}")
                try:
                    entry[col] = fn()
                except Exception as e:  # noqa: BLE001 - report, do not die
                    entry[col] = dict(error=err_text(e))
            off = entry.get("fi", {}).get("off", {}).get("ms")
            if off and "ms" in entry.get("vllm_fi", {}):
                entry["vllm_fi"]["vs_fi_off"] = off / entry["vllm_fi"]["ms"]
            results["shapes"][name] = entry
            json_path.write_text(json.dumps(results, indent=1, default=str))  # kept if a later step dies
            del case, ref
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    set_tp(1)
    if not args.no_sweep:
        log("knob sweep (child processes)")
        results["sweep"] = sweep(args, shapes[0])
    log("done")
    json_path.write_text(json.dumps(results, indent=1, default=str))
    png = args.out / "bench_prefill.png"
    wrote = plot(png, results)
    print(f"wrote {json_path}" + (f" and {png}" if wrote else " (no matplotlib: no plot)"))
    print_table(results)
    return results


if __name__ == "__main__":
    main()
