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

Speculative decoding (``EngineConfig(spec="ngram", num_spec_tokens=k)``, gdn_graphs.engine.spec):
every decoding request runs as a spec row of 1 + k tokens (its last sampled token and k n-gram
drafts), greedy verification accepts a of them, and the next step plans the row with
``accepted = a`` (its state is then read from the request's ring). Blocks are committed to the
prefix cache only up to the accepted tokens. In full mode a step of spec rows only replays a
FULL graph of kind "spec" per bucket (the rows padded to it, 1 + k tokens each); the accepted
counts reach the plan on the host and only change which slots the graph reads.
"""

from __future__ import annotations

import bisect
import itertools
import time
from typing import Iterable, Sequence

import torch

from gdn_graphs import nvtx
from gdn_graphs.engine.prefix_cache import OutOfSlots, PrefixCache
from gdn_graphs.constants import CHUNK
from gdn_graphs.engine.model import HybridGDNModel
from gdn_graphs.engine.request import EngineConfig, Request, as_int, mode_available, token_ids
from gdn_graphs.engine.spec import NgramDrafter, RingPool, SpecStats, accept_count
from gdn_graphs.ops.workspace import ChunkWorkspace
from gdn_graphs.runtime.core import StepContext, step_context
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import classify_rows

# the greedy token of a row whose logits hold a NaN or an Inf (never a vocabulary id)
NON_FINITE = -1

__all__ = ["Engine", "OutOfSlots"]


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
        # The pools live on the model and are this engine's from now on: fresh (zero) pools, and
        # an earlier engine on the same model refuses to run (it would write the same slots).
        model.allocate_pools(cfg.num_slots)
        model.pools_owner = self._pools_key = object()
        # speculative decoding: k drafts per row; the top slots of the pools are the rings
        self._k = k = cfg.num_spec_tokens if cfg.spec else 0
        cache_slots = cfg.num_slots - cfg.ring_slots
        self.cache = PrefixCache(cache_slots, cfg.block_size, cfg.enable_prefix_caching)
        self.rings = RingPool(cache_slots, cfg.max_seqs, k + 2) if k else None
        self.drafter = NgramDrafter(k) if k else None
        self.spec_stats = SpecStats(k)
        # a spec row may compute k tokens past the request's last one: its table covers them
        self.max_blocks = -(-(cfg.max_model_len + k) // cfg.block_size)
        self.limits = PlanLimits(max_seqs=cfg.max_seqs, max_tokens=cfg.max_tokens,
                                 block_size=cfg.block_size, num_slots=cfg.num_slots,
                                 max_blocks_per_seq=self.max_blocks,
                                 max_spec_len=k + 1 if k else 0)
        self.planner = GDNPlanner(self.limits, self.device)
        self.workspace = self._make_workspace()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self._ids = itertools.count()
        self.step_count = 0
        self._compiled = None
        self._graphs = None
        # the kernels' error flag, read along with the sampled tokens (pinned: async copy)
        self._errors_host = torch.zeros(1, dtype=torch.int32,
                                        pin_memory=self.device.type == "cuda")
        # full mode: persistent input ids of a decode graph
        self._ids_buf = torch.zeros(cfg.max_seqs, dtype=torch.long, device=self.device)
        # ... and of a spec graph: 1 + k tokens per row
        self._spec_ids_buf = torch.zeros(cfg.max_seqs * (k + 1), dtype=torch.long,
                                         device=self.device)
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

    @staticmethod
    def _greedy(logits: torch.Tensor) -> torch.Tensor:
        """Greedy tokens, NON_FINITE where a row's logits hold a NaN or an Inf: graph-safe (no
        branch on values), and the host learns it with the tokens it reads anyway."""
        return torch.where(torch.isfinite(logits).all(-1), logits.argmax(-1), NON_FINITE)

    def _decode_graph_fn(self, size: int):
        """A whole decode step for a padded batch of ``size`` rows, reading persistent buffers only:
        returns the greedy next token of every row (padded rows: garbage, ignored)."""
        with step_context(StepContext(self.planner.template(size))):
            h = self.model(self._ids_buf[:size])
            return self._greedy(self.model.logits(h))

    def _spec_graph_fn(self, size: int):
        """A whole step of ``size`` spec rows (1 + k tokens each) from persistent buffers: the
        greedy token after every one of their tokens."""
        L = self._k + 1
        with step_context(StepContext(self.planner.spec_template(size, L))):
            h = self.model(self._spec_ids_buf[:size * L])
            return self._greedy(self.model.logits(h))

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
            if self._k:
                self._spec_ids_buf.zero_()
                self._graphs.capture("spec", self._spec_graph_fn,
                                     inputs=lambda: [*self.planner.buffers(), self._spec_ids_buf,
                                                     *self._pool_tensors()],
                                     progress=self.cfg.progress)

    def _pool_tensors(self):
        out = []
        for blk in self.model.layers:
            out += [blk.gdn.ssm_pool, blk.gdn.conv_pool]
        return out

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt: Sequence[int], max_new_tokens: int) -> Request:
        """Queue a request. Raises TypeError (not an int: bools, floats and strings are refused,
        numpy integers are fine), ValueError (out of range, too long) or OutOfSlots at once if it
        can never run; nothing is queued then."""
        self._check_owns_pools()
        prompt = token_ids(prompt, self.model.cfg.vocab_size)
        max_new_tokens = as_int("max_new_tokens", max_new_tokens)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        total = len(prompt) + max_new_tokens - 1  # Request.tokens_total
        if total > self.cfg.max_model_len:
            raise ValueError(f"request needs {total} tokens ({len(prompt)} prompt + "
                             f"{max_new_tokens} new - 1) > max_model_len={self.cfg.max_model_len}")
        need = self.cache.blocks_needed(total + self._k) if self.cfg.enable_prefix_caching else 1
        if need > self.cache.num_slots:
            raise OutOfSlots(f"request needs {need} state slots, the pool has {self.cache.num_slots}")
        req = Request(next(self._ids), prompt, max_new_tokens, t_arrival=time.perf_counter(),
                      owner=self)
        self.waiting.append(req)
        return req

    def _check_owns_pools(self) -> None:
        if getattr(self.model, "pools_owner", None) is not self._pools_key:
            raise RuntimeError("another Engine was built on this engine's model since, and took "
                               "its state pools: use one model per live engine (the same preset "
                               "and seed give the same weights)")

    def abort(self, req: Request) -> None:
        """Stop a request of this engine and free its slots (nothing happens if it is done).
        Raises ValueError, changing nothing, for a request another engine queued."""
        if req.owner is not self:
            raise ValueError(f"request {req.rid} was not queued by this engine: abort it on the "
                             f"engine whose add_request returned it")
        if not req.done:
            self._retire(req, "aborted")

    def _retire(self, req: Request, status: str, error: str | None = None) -> None:
        """Take a request out of the queues, free its slots, mark it done."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.rid in self.cache:
            self.cache.free(req.rid)
        if self.rings is not None:
            self.rings.free(req.rid)
        req.status, req.error = status, error
        self.finished.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(self, prompts: Iterable[Sequence[int]], max_new_tokens: int) -> list[Request]:
        """Run ``prompts`` (and whatever else is queued) to completion. All or nothing: if a
        prompt is refused or a step raises, this call's requests still unfinished are aborted
        (those of the failed step end with status "error") and the exception propagates."""
        reqs: list[Request] = []
        try:
            for p in prompts:
                reqs.append(self.add_request(p, max_new_tokens))
            while self.has_unfinished():
                self.step()
        except BaseException:
            for r in reqs:
                self.abort(r)
            raise
        return reqs

    # ------------------------------------------------------------------ scheduling

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_seqs:
            req = self.waiting[0]
            try:
                hit = self.cache.allocate(req.rid, req.prompt, req.tokens_total + self._k)
            except OutOfSlots:
                if not self.running:  # nothing will free slots for it: fail this request only
                    self._retire(req, "error", "out of state slots")
                    continue
                return  # wait until running requests free their slots
            self.waiting.pop(0)
            if self.rings is not None:
                self.rings.allocate(req.rid)
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
        with speculation the spec rows (every decoding request, 1 + k tokens), then prefill spans
        in admission order under the token budget."""
        ones, specs, spans = [], [], []
        for r in self.running:
            decoding = r.num_computed >= len(r.prompt)
            if decoding and self._k:
                specs.append((r, 1 + self._k))
            elif decoding or len(r.prompt) - r.num_computed == 1:
                ones.append((r, 1))
        ones += specs
        budget = self.cfg.max_tokens - sum(q for _, q in ones)
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
        """Run one engine step; returns the requests that finished in it.

        If the step raises (planner, forward, sampling), its requests end with status "error"
        (``error`` says why) and their slots go back to the cache: the kernels may already have
        updated their states in place, so the step could not be repeated. The exception is then
        re-raised, so a bug or a device fault is never silent; the engine stays consistent and
        the next ``step()`` serves every other request as if the failed ones had been aborted."""
        # One frame from here to _forward, on purpose: without a GPU the kernels run in Triton's
        # interpreter, whose speed under CPython 3.11 depends on the call depth (a frame-stack
        # chunk can be mapped and unmapped on every call at a chunk boundary); on the CPU tests
        # two more frames here cost 3x the page faults and ~35% more time.
        self._check_owns_pools()
        with nvtx.range("engine.step"):
            self._admit()
            rows = self._schedule()
            if not rows:
                return []
            try:
                with nvtx.range("engine.plan"):
                    ns = [r.num_computed for r, _ in rows]
                    qs = [q for _, q in rows]
                    tables = [self.cache.block_table(r.rid) for r, _ in rows]
                    spec = kw = None
                    if self._k:
                        spec = [q > 1 and r.num_computed >= len(r.prompt) for r, q in rows]
                        kw = dict(spec=spec, rings=[self.rings.ring(r.rid) for r, _ in rows],
                                  accepted=[r.accepted for r, _ in rows])
                    nd, nsp = classify_rows(qs, spec)
                    kind = "spec" if nsp else "decode"
                    use_graph = self.cfg.mode == "full" and len(rows) in (nd, nsp)  # one kind
                    pad = self._graphs.padded_size(kind, len(rows)) if use_graph else None
                    gdn_step = self.planner.plan(
                        ns, qs, tables, pad_decodes_to=None if nsp else pad,
                        pad_spec_to=pad if nsp else None, **(kw or {}))
                    ids, drafts = [], {}
                    for i, (r, q) in enumerate(rows):
                        if spec is not None and spec[i]:
                            drafts[i] = self.drafter.propose(r.tokens)
                            ids.extend([r.tokens[r.num_computed], *drafts[i]])
                        else:
                            ids.extend(r.tokens[r.num_computed:r.num_computed + q])
                    # sample at decode rows, at every token of spec rows and at prefill spans
                    # that finish their prompt: (row, flat index of its first sampled token, count)
                    sample_rows, offs, off = [], [], 0
                    for i, (r, q) in enumerate(rows):
                        offs.append(off)
                        off += q
                        if i in drafts:
                            sample_rows.append((i, off - q, q))
                        elif r.num_computed + q >= len(r.prompt):
                            sample_rows.append((i, off - 1, 1))
                with nvtx.range(f"engine.forward.{'graph' if use_graph else self.cfg.mode}"):
                    record = None
                    if use_graph:
                        greedy = self._forward_full(ids, kind, len(rows))
                        self._copy_errors()
                    else:
                        record = {} if self.cfg.debug_record else None
                        hidden = self._forward(ids, gdn_step, record)
                        self._copy_errors()
                        greedy = None
                        if sample_rows:
                            idx = [t + j for _, t, c in sample_rows for j in range(c)]
                            idx = torch.tensor(idx, device=self.device)
                            greedy = self._greedy(self.model.logits(hidden[idx]))
                    sampled, accepted = self._verify(sample_rows, greedy, drafts, use_graph)
                    if record is not None:
                        for i, (r, q) in enumerate(rows):
                            keep = accepted.get(i, q)
                            per_layer = [record[l][0][offs[i]:offs[i] + keep]
                                         for l in range(self.model.cfg.num_layers)]
                            r.core_trace.append((r.num_computed, per_layer))
                    self._check_errors(synced=bool(sample_rows))
                return self._update(rows, sampled, accepted)
            except Exception as e:
                for r, _ in rows:
                    if not r.done:
                        self._retire(r, "error", f"{type(e).__name__}: {e}")
                raise

    def _verify(self, sample_rows, greedy, drafts, from_graph):
        """Greedy tokens per sampled row ({row: [tokens]}) and, for spec rows, the tokens greedy
        verification accepts ({row: a}). ``greedy``: the flat argmax over the sampled positions
        (eager) or over the whole padded batch (a graph); None when nothing is sampled."""
        if not sample_rows:
            return {}, {}
        toks = greedy.tolist()  # (the sync that also brings the error flag)
        sampled, pos = {}, 0
        for i, t, c in sample_rows:
            start = t if from_graph else pos
            sampled[i] = toks[start:start + c]
            pos += c
        accepted = {i: accept_count(d, sampled[i]) for i, d in drafts.items()}
        self.spec_stats.add_step(list(accepted.values()))
        return sampled, accepted

    def _copy_errors(self) -> None:
        """Enqueue the step's kernel error flag to pinned host memory; the sync that reads the
        sampled tokens then brings it along (no sync of its own)."""
        self._errors_host.copy_(self.planner.error_flag, non_blocking=self.device.type == "cuda")

    def _check_errors(self, synced: bool) -> None:
        """Raise if a kernel met something plan() should have refused (a bug, never bad input:
        add_request and plan() validate it); the step's requests then fail alone."""
        if not synced and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # a prefill-only step
        code = int(self._errors_host[0])
        if code:
            raise RuntimeError(f"GDN kernels reported {', '.join(self.planner.error_names(code))} "
                               f"(error code {code}) in step {self.step_count}")

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

    def _forward_full(self, ids: list[int], kind: str, rows: int) -> torch.Tensor:
        """Replay the ``kind`` graph ("decode" or "spec") for ``rows`` rows after copying their
        token ids into its input buffer; returns the graph's greedy tokens (padded batch)."""
        buf, fn = ((self._ids_buf, self._decode_graph_fn) if kind == "decode"
                   else (self._spec_ids_buf, self._spec_graph_fn))
        buf[:len(ids)].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=False)
        out, size = self._graphs.run(kind, rows, fn)
        return out

    def _update(self, rows, sampled, accepted) -> list[Request]:
        now = time.perf_counter()
        done = []
        for i, (r, q) in enumerate(rows):
            a = accepted.get(i)
            r.num_computed += q if a is None else a
            r.accepted = a or 0
            r.metrics.num_steps += 1
            if i in sampled and NON_FINITE in sampled[i][:a or 1]:
                # its logits (so its hidden state, and maybe its GDN state) hold a NaN or an
                # Inf: that request fails alone; nothing of this step is committed for it
                self._retire(r, "error", f"non-finite logits (NaN or Inf) after "
                             f"{r.num_computed} tokens, in step {self.step_count}")
                continue
            if i in sampled:
                new = sampled[i][:a or 1][:r.max_new_tokens - len(r.output)]
                r.output.extend(new)
                if r.t_first is None:
                    r.t_first = now
                r.t_last = now
            # only accepted tokens commit blocks (a spec row may have run past the last token
            # kept when it hit max_new_tokens: that request finishes now)
            self.cache.commit(r.rid, r.tokens, min(r.num_computed, len(r.tokens)))
            if len(r.output) >= r.max_new_tokens:
                self._retire(r, "finished")
                m = r.metrics
                m.ttft_s = r.t_first - r.t_arrival
                if len(r.output) > 1 and r.t_last > r.t_first:
                    m.decode_tok_s = (len(r.output) - 1) / (r.t_last - r.t_first)
                done.append(r)
        self.step_count += 1
        return done
