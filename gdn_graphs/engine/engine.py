"""The embedded engine: requests, a chunked-prefill / continuous-batching scheduler, greedy sampling,
prefix caching at every block boundary, and three execution modes.

One step:
    schedule (host)  -> rows: decode rows first (one token each), then prefill spans
    cache            -> block tables (slots), hits counted at admission
    planner.plan()   -> persistent device buffers (slots, chunk table) for the GDN kernels
    forward          -> eager | piecewise (torch.compile, graph partition around gdn_core)
                        | full (a captured CUDA graph per decode bucket; mixed steps piecewise)
    sample (greedy)  -> append tokens, commit full blocks to the prefix cache, finish requests

Scheduling rules that make warm == cold bit for bit:
* a cache hit is a whole number of blocks (B is a multiple of the 64-token chunk);
* every prefill step of a request ends at an absolute position that is a multiple of 64, or at
  the prompt's end, so a chunk is never split across steps (a split changes the rounding);
* a prompt whose last chunk holds one token (len % 64 == 1) computes that token in a step of its
  own, as a one-token row with the decodes, in the cold run and the warm run alike (the planner
  treats leading one-token rows as decodes, so the same kernel runs in both).

Modes:
* ``eager``: the model runs op by op.
* ``piecewise``: ``torch.compile`` of the model. gdn_core is tagged cudagraph_unsafe, so Inductor's
  graph partition splits the graph around it; on a GPU with mode="reduce-overhead" the pieces
  between GDN cores replay as CUDA graphs (cudagraph trees), on a CPU they run as compiled C++.
  The token count is padded up to a few buckets and marked dynamic, so there is one compile and a
  bounded number of recorded graphs; the batch layout reaches the op through the StepContext, not
  through the graph, so nothing recompiles per step.
* ``full``: pure decode steps replay a FULL CUDA graph (GraphManager) of the whole model (embedding,
  every layer's GDN core, MLPs, lm_head and argmax) for the padded batch size; the graph reads only
  persistent buffers: the planner's slot buffers, the input-id buffer and the pools. Steps with
  prefill rows (and batches above the largest bucket) run piecewise. Needs a CUDA GPU.
"""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from gdn_graphs import nvtx
from gdn_graphs.engine.prefix_cache import OutOfSlots, PrefixCache
from gdn_graphs.constants import CHUNK
from gdn_graphs.engine.model import HybridGDNModel
from gdn_graphs.ops.chunk import ChunkWorkspace
from gdn_graphs.runtime.core import StepContext, step_context
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import count_decode_rows

__all__ = ["EngineConfig", "Request", "Engine", "RequestMetrics", "MODES", "mode_available",
           "OutOfSlots"]

MODES = ("eager", "piecewise", "full")


def mode_available(mode: str, device) -> tuple[bool, str]:
    """(available, why not). ``full`` needs CUDA; eager and piecewise run anywhere."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    if mode == "full" and torch.device(device).type != "cuda":
        return False, "n/a (no GPU)"
    return True, ""


@dataclass
class EngineConfig:
    mode: str = "eager"
    enable_prefix_caching: bool = True
    block_size: int = 64
    num_slots: int = 64
    max_seqs: int = 8               # rows per step
    max_tokens: int = 256           # token budget per step (a multiple of 64)
    max_model_len: int = 4096       # prompt + generated tokens of one request
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8)     # full mode: captured batch sizes
    token_buckets: tuple[int, ...] | None = None       # piecewise padding (default: powers of 2)
    compile_mode: str | None = None  # torch.compile mode; None: "reduce-overhead" on CUDA
    compile_backend: str = "inductor"  # "aot_eager" in CPU tests (no C++ compile)
    debug_record: bool = False      # keep every GDN core output per request (tests)
    debug_ptrs: bool = False        # GraphManager's data_ptr guard
    progress: bool = True           # tqdm bars while capturing graphs
    graph_backend: object = None    # GraphManager backend (tests: a CPU stand-in for CUDA graphs)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {MODES}")
        if self.block_size % CHUNK:
            raise ValueError(f"block_size must be a multiple of {CHUNK}, got {self.block_size}")
        if self.max_tokens % CHUNK or self.max_tokens < CHUNK:
            raise ValueError(f"max_tokens must be a positive multiple of {CHUNK} (prefill steps end "
                             f"on chunk boundaries), got {self.max_tokens}")
        if self.max_seqs < 1 or self.num_slots < 1:
            raise ValueError("max_seqs and num_slots must be >= 1")


@dataclass
class RequestMetrics:
    queried_tokens: int = 0       # prompt tokens looked up in the prefix cache
    hit_tokens: int = 0           # of those, served from cached states
    ttft_s: float = float("nan")  # time to first token (from add_request)
    decode_tok_s: float = float("nan")  # generated tokens after the first / their time
    num_steps: int = 0


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: str = "waiting"       # waiting | running | finished | aborted | error
    error: str | None = None
    t_arrival: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # debug_record: (start position, [per layer: core output rows for this step's tokens])
    core_trace: list = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def tokens_total(self) -> int:
        """Tokens this request can ever compute (the last sampled one is never fed back)."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def done(self) -> bool:
        return self.status in ("finished", "aborted", "error")

    def core_outputs(self, layer: int) -> dict[int, torch.Tensor]:
        """debug_record: {absolute position: core output [HV, V]} of one layer."""
        out = {}
        for start, per_layer in self.core_trace:
            for j, row in enumerate(per_layer[layer]):
                out[start + j] = row
        return out


class Engine:
    """Greedy generation over a HybridGDNModel with prefix caching at every block boundary.

    >>> eng = Engine(model, EngineConfig(mode="eager"))
    >>> reqs = eng.generate([prompt_a, prompt_b], max_new_tokens=16)
    """

    def __init__(self, model: HybridGDNModel, config: EngineConfig | None = None):
        self.model = model
        self.cfg = cfg = config or EngineConfig()
        self.device = model.device
        ok, why = mode_available(cfg.mode, self.device)
        if not ok and cfg.graph_backend is None:
            raise RuntimeError(f"mode {cfg.mode!r} is unavailable: {why}")
        if model.num_slots != cfg.num_slots:
            model.allocate_pools(cfg.num_slots)
        self.cache = PrefixCache(cfg.num_slots, cfg.block_size, cfg.enable_prefix_caching)
        self.max_blocks = -(-cfg.max_model_len // cfg.block_size)
        self.limits = PlanLimits(max_seqs=cfg.max_seqs, max_tokens=cfg.max_tokens,
                                 block_size=cfg.block_size, num_slots=cfg.num_slots,
                                 max_blocks_per_seq=self.max_blocks)
        self.planner = GDNPlanner(self.limits, self.device)
        self.workspace = self._make_workspace()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self._ids = itertools.count()
        self.step_count = 0
        self._compiled = None
        self._graphs = None
        # full mode: persistent input ids of a decode graph
        self._ids_buf = torch.zeros(cfg.max_seqs, dtype=torch.long, device=self.device)
        if cfg.mode in ("piecewise", "full"):
            self._setup_piecewise()
        if cfg.mode == "full":
            self._setup_full()

    # ------------------------------------------------------------------ setup

    def _make_workspace(self) -> ChunkWorkspace:
        c = self.model.cfg
        return ChunkWorkspace(self.cfg.max_tokens, c.num_v_heads, c.head_k_dim, c.head_v_dim,
                              c.dtype, self.device, HK=c.num_k_heads)

    def _token_buckets(self) -> list[int]:
        if self.cfg.token_buckets:
            return sorted(set(self.cfg.token_buckets) | {self.cfg.max_tokens})
        b, out = 16, []
        while b < self.cfg.max_tokens:
            out.append(b)
            b *= 2
        return out + [self.cfg.max_tokens]

    def _setup_piecewise(self):
        import torch._inductor.config as inductor_config

        # Inductor splits the graph around ops tagged cudagraph_unsafe (gdn_core) so the pieces
        # in between can be CUDA graphs; it is the default in recent torch, be explicit anyway.
        inductor_config.graph_partition = True
        mode = self.cfg.compile_mode
        if mode is None and self.device.type == "cuda":
            mode = "reduce-overhead"
        self._buckets = self._token_buckets()
        # One compiled wrapper per model and mode: engines over the same model (caching on/off)
        # share Dynamo's cache instead of compiling again.
        shared = self.model.__dict__.setdefault("_gdn_compiled", {})
        key = (self.cfg.compile_backend, mode)
        if key not in shared:
            kw = dict(mode=mode) if self.cfg.compile_backend == "inductor" else {}
            shared[key] = torch.compile(self.model, backend=self.cfg.compile_backend,
                                        dynamic=None, fullgraph=True, **kw)
        self._compiled = shared[key]

    def _decode_graph_fn(self, size: int):
        """A whole decode step for a padded batch of ``size`` rows, reading persistent buffers only:
        returns the greedy next token of every row (padded rows: garbage, ignored)."""
        with step_context(StepContext(self.planner.template(size))):
            h = self.model(self._ids_buf[:size])
            return self.model.logits(h).argmax(-1)

    def _setup_full(self):
        from gdn_graphs.runtime.graphs import GraphManager

        buckets = [b for b in self.cfg.decode_buckets if b <= self.cfg.max_seqs]
        self._graphs = GraphManager(buckets, debug_ptrs=self.cfg.debug_ptrs,
                                    backend=self.cfg.graph_backend)
        # Warm-up and capture run fn on whatever the buffers hold: an empty plan (every slot -1)
        # makes them touch no state.
        self.planner.plan([], [], [])
        self._ids_buf.zero_()
        with torch.no_grad():
            self._graphs.capture("decode", self._decode_graph_fn,
                                 inputs=lambda: [*self.planner.buffers(), self._ids_buf,
                                                 *self._pool_tensors()],
                                 progress=self.cfg.progress)

    def _pool_tensors(self):
        out = []
        for blk in self.model.layers:
            out += [blk.gdn.ssm_pool, blk.gdn.conv_pool]
        return out

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt: Sequence[int], max_new_tokens: int) -> Request:
        """Queue a request. Raises ValueError / OutOfSlots at once if it can never run."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        vocab = self.model.cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
        req = Request(next(self._ids), prompt, max_new_tokens, t_arrival=time.perf_counter())
        if req.tokens_total > self.cfg.max_model_len:
            raise ValueError(f"request needs {req.tokens_total} tokens > max_model_len="
                             f"{self.cfg.max_model_len}")
        need = self.cache.blocks_needed(req.tokens_total) if self.cfg.enable_prefix_caching else 1
        if need > self.cfg.num_slots:
            raise OutOfSlots(f"request needs {need} state slots, the pool has {self.cfg.num_slots}")
        self.waiting.append(req)
        return req

    def abort(self, req: Request) -> None:
        if req.done:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.rid in self.cache:
            self.cache.free(req.rid)
        req.status = "aborted"
        self.finished.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(self, prompts: Iterable[Sequence[int]], max_new_tokens: int) -> list[Request]:
        reqs = [self.add_request(p, max_new_tokens) for p in prompts]
        while self.has_unfinished():
            self.step()
        return reqs

    # ------------------------------------------------------------------ scheduling

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_seqs:
            req = self.waiting[0]
            try:
                hit = self.cache.allocate(req.rid, req.prompt, req.tokens_total)
            except OutOfSlots:
                if not self.running:  # nothing will free slots for it: fail this request only
                    self.waiting.pop(0)
                    req.status, req.error = "error", "out of state slots"
                    self.finished.append(req)
                    continue
                return  # wait until running requests free their slots
            self.waiting.pop(0)
            req.num_computed = hit
            req.metrics.queried_tokens = len(req.prompt)
            req.metrics.hit_tokens = hit
            req.status = "running"
            self.running.append(req)

    def _prefill_span(self, req: Request, budget: int) -> int:
        """Tokens of ``req``'s prompt to compute now, within ``budget``: the step ends on a
        multiple of 64 or at the prompt's end (a last chunk of one token gets a step alone)."""
        n, L = req.num_computed, len(req.prompt)
        end = min(n + budget, L)
        if end < L or (L % CHUNK == 1 and n < L - 1):
            end = end // CHUNK * CHUNK
        return max(end - n, 0)

    def _schedule(self) -> list[tuple[Request, int]]:
        """Rows of the next step: one-token rows first (decodes, single-token prompt ends), then
        prefill spans in admission order under the token budget."""
        ones, spans = [], []
        for r in self.running:
            if r.num_computed >= len(r.prompt) or len(r.prompt) - r.num_computed == 1:
                ones.append((r, 1))
        budget = self.cfg.max_tokens - len(ones)
        for r in self.running:
            if len(r.prompt) - r.num_computed > 1:
                q = self._prefill_span(r, budget)
                if q > 0:
                    spans.append((r, q))
                    budget -= q
        # A prefill span of one token would be planned as a decode row; the rules above only
        # produce spans of >= 2 tokens (they start on a multiple of 64 and end on one or at L).
        assert all(q > 1 for _, q in spans)
        return ones + spans

    # ------------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that finished in it."""
        with nvtx.range("engine.step"):
            self._admit()
            rows = self._schedule()
            if not rows:
                return []
            with nvtx.range("engine.plan"):
                ns = [r.num_computed for r, _ in rows]
                qs = [q for _, q in rows]
                tables = [self.cache.block_table(r.rid) for r, _ in rows]
                nd = count_decode_rows(qs)
                pure_decode = nd == len(rows)
                use_graph = self.cfg.mode == "full" and pure_decode
                pad = self._graphs.padded_size("decode", nd) if use_graph else None
                gdn_step = self.planner.plan(ns, qs, tables, pad_decodes_to=pad)
                ids = []
                for r, q in rows:
                    ids.extend(r.tokens[r.num_computed:r.num_computed + q])
                # sample at decode rows and at prefill spans that finish their prompt
                sample_rows, offs, off = [], [], 0
                for i, (r, q) in enumerate(rows):
                    offs.append(off)
                    off += q
                    if r.num_computed + q >= len(r.prompt):
                        sample_rows.append((i, off - 1))
            with nvtx.range(f"engine.forward.{'graph' if use_graph else self.cfg.mode}"):
                if use_graph:
                    next_tok = self._forward_full(ids, nd)
                    toks = next_tok[: len(rows)].tolist()
                    sampled = {i: toks[i] for i, _ in sample_rows}
                else:
                    record = {} if self.cfg.debug_record else None
                    hidden = self._forward(ids, gdn_step, record)
                    sampled = {}
                    if sample_rows:
                        idx = torch.tensor([t for _, t in sample_rows], device=self.device)
                        toks = self.model.logits(hidden[idx]).argmax(-1).tolist()
                        sampled = {i: t for (i, _), t in zip(sample_rows, toks)}
                    if record is not None:
                        for i, (r, q) in enumerate(rows):
                            per_layer = [record[l][0][offs[i]:offs[i] + q]
                                         for l in range(self.model.cfg.num_layers)]
                            r.core_trace.append((r.num_computed, per_layer))
            return self._update(rows, sampled)

    def _forward(self, ids: list[int], step, record) -> torch.Tensor:
        T = len(ids)
        ctx = StepContext(step, workspace=self.workspace, record=record)
        if self._compiled is None:
            x = torch.tensor(ids, dtype=torch.long, device=self.device)
            with step_context(ctx):
                return self.model(x)
        i = bisect.bisect_left(self._buckets, T)
        Tp = self._buckets[i] if i < len(self._buckets) else T
        x = torch.zeros(Tp, dtype=torch.long, device=self.device)
        x[:T] = torch.tensor(ids, dtype=torch.long)
        torch._dynamo.mark_dynamic(x, 0)
        with step_context(ctx):
            h = self._compiled(x)
        return h[:T].clone()  # cudagraph trees may overwrite h on the next replay

    def _forward_full(self, ids: list[int], nd: int) -> torch.Tensor:
        self._ids_buf[:nd].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=False)
        out, size = self._graphs.run("decode", nd, self._decode_graph_fn)
        return out

    def _update(self, rows, sampled) -> list[Request]:
        now = time.perf_counter()
        done = []
        for i, (r, q) in enumerate(rows):
            r.num_computed += q
            r.metrics.num_steps += 1
            if i in sampled:
                r.output.append(sampled[i])
                if r.t_first is None:
                    r.t_first = now
                r.t_last = now
            self.cache.commit(r.rid, r.tokens, r.num_computed)
            if len(r.output) >= r.max_new_tokens:
                r.status = "finished"
                self.running.remove(r)
                self.cache.free(r.rid)
                self.finished.append(r)
                m = r.metrics
                m.ttft_s = r.t_first - r.t_arrival
                if len(r.output) > 1 and r.t_last > r.t_first:
                    m.decode_tok_s = (len(r.output) - 1) / (r.t_last - r.t_first)
                done.append(r)
        self.step_count += 1
        return done
