"""Host time of a decode step's GDN metadata builds, the plugin's against vLLM 0.26's own, on
vLLM's CPU build (issue 12: the plugin decodes 4% slower than vLLM's own mode with n-gram k = 3).

    PYTHONPATH=. python profiling/bench_builder_host.py [--rows 16,64] [--steps 400] [--profile]

vLLM calls every KV-cache group's builder each step; Qwen3-Next has three GDN groups, so one step
here is three ``build`` calls, on the same CommonAttentionMetadata with each group's block table,
as vLLM's model runner makes them (engine config of the H200 run: max_num_seqs 64,
max_num_batched_tokens 8192, max_model_len 8192, block 192, CUDA-graph sizes up to 64 tokens,
FULL_AND_PIECEWISE). The plugin's builder (mode "all") against vLLM's GDNAttentionMetadataBuilder
in its own "align" mode. Token counts change every step (each row moves on by the tokens it
accepted), so every step plans afresh. Step kinds:

* ``spec``: every row verifies k drafts (1 + k tokens): the FULL-graph decode step;
* ``mixed``: each row verifies k drafts with probability 1/16 (at least one row does), the rest
  decode one token (vLLM passes -1 drafts for them): what n-gram on the random tiny model mostly
  schedules (the H200 run: 249 drafts in ~230 decode steps of 16 rows); not a uniform batch, so
  run piecewise in both modes (the GDN layers' forward runs eagerly);
* ``nodraft``: no row has drafts (vLLM then passes no draft counts at all); piecewise too.

Reported per step: median host time (us) of the three builds, and the device launches they
enqueue: torch ops that read or write a device tensor, views excluded, counted in a second pass
with the builders on the "meta" device (the plugin's ErrorWatch then has no device flag to copy;
on CUDA it adds one D2H copy per step, counted here as one). The tensors are CPU tensors and this
is not the GPU host: compare the columns with each other, not with the H200's step time.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import pstats
import statistics
import tempfile
import time
from collections import Counter

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

K_SPEC = 3  # 0 with --no-spec: an engine without speculative decoding
BLOCK = 192
MAX_SEQS, MAX_TOKENS, MAX_LEN, GRAPH_TOKENS = 64, 8192, 8192, 64
NGRAM = {"method": "ngram", "num_speculative_tokens": K_SPEC, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}


# --------------------------------------------------------------------------------- vLLM objects

def vllm_on_cpu() -> str:
    """vLLM's CPU platform, the plugin registered, a tiny Qwen3-Next config on disk (its path)."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    import gdn_graphs.vllm as plugin
    from tools.tiny_model import make_tiny_qwen3_next

    assert plugin.register() is True
    path = tempfile.mkdtemp(prefix="bench_builder_host_")
    return str(make_tiny_qwen3_next(f"{path}/qwen3_next", dtype="bfloat16", weights=False))


def engine_config(path: str, own: bool):
    """The H200 run's engine config; ``own``: the plugin off (vLLM's "align" mode). The CPU
    platform turns CUDA graphs off: set them back as the GPU has them (the builders read them)."""
    from vllm.config import CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    extra = {"additional_config": {"gdn_graphs": False}} if own else {}
    cfg = EngineArgs(model=path, skip_tokenizer_init=True, max_model_len=MAX_LEN,
                     enable_prefix_caching=True, speculative_config=NGRAM if K_SPEC else None,
                     max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS,
                     **extra).create_engine_config()
    cc = cfg.compilation_config
    cc.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cc.max_cudagraph_capture_size = GRAPH_TOKENS
    assert cfg.cache_config.mamba_cache_mode == ("align" if own else "all")
    return cfg


def gdn_spec(own: bool):
    from vllm.v1.kv_cache_interface import MambaSpec

    from gdn_graphs.vllm.builder import spec_lookahead

    # the tiny model's GDN layer: conv_dim 2*4*64 + 8*64 = 1024, kernel 4; state 8 x 64 x 64
    return MambaSpec(shapes=((3 + K_SPEC, 1024), (8, 64, 64)),
                     dtypes=(torch.bfloat16, torch.float32), block_size=BLOCK,
                     mamba_cache_mode="align" if own else "all",
                     num_speculative_blocks=K_SPEC if own or not K_SPEC else spec_lookahead(K_SPEC))


def make_builders(path: str, own: bool, device: torch.device) -> tuple[list, int]:
    """Three GDN builders of one model (vLLM's own or the plugin's) and their table width."""
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    from gdn_graphs.vllm.v0_26.model import GDNGraphsBuilder

    cfg = engine_config(path, own)
    spec = gdn_spec(own)
    cls = GDNAttentionMetadataBuilder if own else GDNGraphsBuilder
    names = [f"model.layers.{i}.linear_attn" for i in range(3)]
    if not own:  # the model's layers carry one GDNResources: the groups share its planner
        import types

        from gdn_graphs.vllm.v0_26.model import _new_resources

        res = _new_resources(cfg)
        for n in names:
            cfg.compilation_config.static_forward_context[n] = types.SimpleNamespace(
                _gdn_resources=res)
    builders = [cls(spec, [n], cfg, device) for n in names]
    _no_pinned_memory()
    return builders, spec.max_num_blocks_per_req(cfg, MAX_LEN)


def _no_pinned_memory():
    """vLLM modules read PIN_MEMORY at import, some before the CPU platform was set: no pinned
    memory on this machine."""
    import sys

    for name, mod in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(mod, "PIN_MEMORY", False) is True:
            mod.PIN_MEMORY = False


# ---------------------------------------------------------------------------------- the steps

@dataclasses.dataclass
class Step:
    q: np.ndarray         # scheduled tokens per row
    n: np.ndarray         # computed before the step
    drafts: np.ndarray    # vLLM's num_decode_draft_tokens (-1: none)
    accepted: np.ndarray  # vLLM's num_accepted_tokens (1 + drafts accepted last step; 1: none)


def make_steps(rows: int, kind: str, count: int, seed: int = 0) -> list[Step]:
    rng = np.random.default_rng(seed)
    n = rng.integers(300, 3000, rows)
    accepted = np.ones(rows, dtype=np.int32)
    out = []
    for _ in range(count):
        share = {"spec": 1.0, "mixed": 1 / 16, "nodraft": 0.0}[kind]
        has = rng.random(rows) < share
        if kind == "mixed" and not has.any():
            has[rng.integers(rows)] = True
        drafts = np.where(has, K_SPEC, -1).astype(np.int32)
        q = np.where(has, 1 + K_SPEC, 1)
        out.append(Step(q, n.copy(), drafts, accepted.copy()))
        took = np.where(has, rng.integers(0, K_SPEC + 1, rows), 0)
        n = n + 1 + took
        accepted = (1 + took).astype(np.int32)
    return out


def metadata(step: Step, table: torch.Tensor, device: torch.device):
    """The CommonAttentionMetadata vLLM's runner gives a group's builder for this step."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    rows = len(step.q)
    qsl_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(step.q)]).astype(np.int32))
    seq_cpu = torch.from_numpy((step.n + step.q).astype(np.int32))
    T = int(qsl_cpu[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl_cpu.to(device), query_start_loc_cpu=qsl_cpu,
        seq_lens=seq_cpu.to(device), _seq_lens_cpu=seq_cpu,
        _num_computed_tokens_cpu=torch.from_numpy(step.n.astype(np.int32)),
        seq_lens_cpu_upper_bound=seq_cpu, num_reqs=rows, num_actual_tokens=T,
        max_query_len=int(step.q.max()), max_seq_len=int(seq_cpu.max()),
        block_table_tensor=table[:rows],
        slot_mapping=torch.zeros(T, dtype=torch.int64, device=device))


def group_tables(width: int, device: torch.device) -> list[torch.Tensor]:
    """Each group's persistent block table (vLLM's: [max_num_seqs, width], sliced per step),
    distinct ids per group."""
    g = torch.Generator().manual_seed(1)
    return [torch.randperm(MAX_SEQS * width * 3, generator=g)[:MAX_SEQS * width]
            .add_(1).to(torch.int32).view(MAX_SEQS, width).to(device) for _ in range(3)]


def step_calls(builders, tables, steps, device):
    """Per step: the three (builder, args, kwargs) calls vLLM's runner makes."""
    calls = []
    for s in steps:
        spec = bool((s.drafts >= 0).any())
        extra = {}
        if spec:  # vLLM passes the counts only in steps with drafts (use_spec_decode)
            extra = dict(num_accepted_tokens=torch.from_numpy(s.accepted).to(device),
                         num_decode_draft_tokens_cpu=torch.from_numpy(s.drafts))
        calls.append([(b, metadata(s, t, device), extra) for b, t in zip(builders, tables)])
    return calls


def run_step(step_call):
    for b, m, extra in step_call:
        b.build(0, m, **extra)


# --------------------------------------------------------------------------------- measuring

def time_steps(call_lists, repeats: int = 5) -> list[float]:
    """Median host time (us) of one step's three builds for each list of step calls, the best of
    ``repeats`` passes; the lists take turns pass by pass (this machine's noise hits them alike)."""
    best = [[] for _ in call_lists]
    gc.collect()
    gc.disable()  # a collection inside a timed step is noise here (vLLM freezes its startup heap)
    try:
        _time_passes(call_lists, repeats, best)
    finally:
        gc.enable()
    return [min(b) * 1e6 for b in best]


def _time_passes(call_lists, repeats, best):
    for _ in range(repeats):
        for calls, out in zip(call_lists, best):
            ts = []
            for c in calls:
                t0 = time.perf_counter()
                run_step(c)
                ts.append(time.perf_counter() - t0)
            out.append(statistics.median(ts))


_VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "as_strided", "alias", "detach",
             "unsqueeze", "squeeze", "expand", "t", "transpose", "unflatten", "_reshape_alias",
             "reshape", "lift_fresh", "split", "unbind", "permute", "diagonal"}


class LaunchCounter(TorchDispatchMode):
    """Counts the ops that touch a "meta" tensor (the stand-in device), views excluded."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [x for x in torch.utils._pytree.tree_leaves((args, kwargs, out))
                   if isinstance(x, torch.Tensor)]
        if name not in _VIEW_OPS and any(t.device.type == "meta" for t in tensors):
            self.ops[name] += 1
        return out


def count_launches(path: str, own: bool, rows: int, kind: str, n: int = 20) -> tuple[float, Counter]:
    meta = torch.device("meta")
    builders, width = make_builders(path, own, meta)
    if not own:  # no device flag to bring back on meta: count its one copy by hand below
        builders[0]._steps.planner.errors.poll = lambda: None
    calls = step_calls(builders, group_tables(width, meta), make_steps(rows, kind, n + 2), meta)
    for c in calls[:2]:
        run_step(c)
    counter = LaunchCounter()
    with counter:
        for c in calls[2:]:
            run_step(c)
    per_step = sum(counter.ops.values()) / n + (0 if own else 1)
    return per_step, Counter({k: v / n for k, v in counter.ops.items()})


def profile(path: str, own: bool, rows: int, kind: str) -> str:
    cpu = torch.device("cpu")
    builders, width = make_builders(path, own, cpu)
    calls = step_calls(builders, group_tables(width, cpu), make_steps(rows, kind, 300), cpu)
    prof = cProfile.Profile()
    prof.enable()
    for c in calls:
        run_step(c)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    return s.getvalue()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="16,64")
    p.add_argument("--kinds", default="spec,mixed,nodraft")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--profile", action="store_true", help="cProfile of the plugin's builds")
    p.add_argument("--no-spec", action="store_true",
                   help="engines without speculative decoding: plain decode steps (kind nodraft, "
                        "FULL graphs on the GPU)")
    a = p.parse_args(argv)
    global K_SPEC
    if a.no_spec:
        K_SPEC = 0
        a.kinds = "nodraft"
    path = vllm_on_cpu()
    torch.set_num_threads(1)  # tiny tensors: a thread pool only adds noise
    cpu = torch.device("cpu")
    print(f"{'kind':8} {'rows':>4} | {'ours us':>8} {'launch':>6} | {'vLLM us':>8} {'launch':>6}")
    for kind in a.kinds.split(","):
        for rows in map(int, a.rows.split(",")):
            lists = []
            for own in (False, True):
                builders, width = make_builders(path, own, cpu)
                calls = step_calls(builders, group_tables(width, cpu),
                                   make_steps(rows, kind, a.steps), cpu)
                run_step(calls[0])  # first-call imports and caches out of the timing
                lists.append(calls)
            t0, t1 = time_steps(lists)
            (l0, _), (l1, _) = (count_launches(path, own, rows, kind) for own in (False, True))
            print(f"{kind:8} {rows:4d} | {t0:8.0f} {l0:6.1f} | {t1:8.0f} {l1:6.1f}", flush=True)
            if a.profile:
                print(profile(path, False, rows, kind))
    for own in (False, True):
        kind = "spec" if K_SPEC else "nodraft"
        _, ops = count_launches(path, own, 16, kind)
        print(("vLLM" if own else "ours"), f"launches per step, {kind} 16:",
              dict(sorted(ops.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
