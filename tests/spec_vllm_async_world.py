"""spec_vllm_world under vLLM's async scheduling: vLLM's own AsyncScheduler schedules step t + 1
before step t's verdict is back, so the computed-token counts it hands the worker (and the
builder's host seq_lens) count step t's drafts as accepted; the true counts reach the builder as
the device's seq_lens (vLLM's model runner corrects them there). The world keeps one step in
flight as vLLM's engine core does (schedule t + 1, then process t's output), decides each
verifying row's acceptance on the worker side (random 0 .. drafts: the drafts are the worker's,
the scheduler only holds placeholders), and checks with spec_vllm_world's oracle that every
slot the kernels get reads the state after the request's TRUE tokens, every state lands where
the next step looks for it, and no page the prefix cache holds changes. ``optimistic=True``
hands the builder the host's counts as the device's too (the bug this guards against)."""

from __future__ import annotations

import numpy as np
import torch

from spec_vllm_world import SpecWorld, spec_scheduler
from test_vllm_state_pages import B, request


def async_scheduler(path, num_blocks, k):
    """spec_scheduler's config and pages, with vLLM's AsyncScheduler (vLLM's CPU build keeps
    async scheduling off in the config; the scheduler class is what it would run)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.structured_output import StructuredOutputManager

    sched, cfg, gdn = spec_scheduler(path, num_blocks, k)
    cfg.scheduler_config.async_scheduling = True
    a = AsyncScheduler(cfg, sched.kv_cache_config, StructuredOutputManager(cfg), block_size=B,
                       log_stats=True)
    return a, cfg, gdn


class AsyncSpecWorld(SpecWorld):
    def __init__(self, path, num_blocks, k, seed=0, optimistic=False):
        super().__init__(path, num_blocks, k, seed)
        self.sched, cfg, gdn = async_scheduler(path, num_blocks, k)
        self.optimistic = optimistic
        self.reqs = {}                      # every request ever added (finished ones too)
        self.n_true: dict[str, int] = {}    # the worker's true computed tokens
        self.in_flight = None               # (scheduler output, model runner output)
        self.behind = []                    # host count - true count of each verifying row
        self.dead_rows = 0

    def add(self, rid, prompt, max_tokens):
        req = super().add(rid, prompt, max_tokens)
        self.reqs[rid] = req
        return req

    def step(self):
        """Schedule step t + 1 while step t is in flight, process step t's output, then run step
        t + 1 (the GPU runs steps in order; what it knows of step t's tokens, the host learns
        in that output): one step in flight, vLLM's engine-core order."""
        out = self.sched.schedule()
        self.steps += 1
        self.preempted += len(out.preempted_req_ids or ())
        if self.in_flight is not None:
            self.sched.update_from_output(*self.in_flight)
        self.in_flight = None
        if out.num_scheduled_tokens:
            self._update_tables(out)
            rows = self._async_rows(out)
            for g in range(3):
                self._check_and_apply(g, rows)
            self.in_flight = (out, self._verdict(rows))
        self._check_cached()
        return out

    def run(self, max_steps=4000):
        while self.sched.has_unfinished_requests() or self.in_flight is not None:
            self.step()
            assert self.steps < max_steps, "did not finish"

    def _async_rows(self, out):
        """(rid, host n, q, the row's sequence, true base, drafts, true n) in vLLM's order."""
        host = {nr.req_id: nr.num_computed_tokens for nr in out.scheduled_new_reqs}
        cd = out.scheduled_cached_reqs
        host.update(zip(cd.req_ids, cd.num_computed_tokens))
        exact = {nr.req_id for nr in out.scheduled_new_reqs} | set(cd.resumed_req_ids)
        rows = []
        for rid, q in out.num_scheduled_tokens.items():
            n_host, req = host[rid], self.reqs[rid]
            if rid in exact or rid not in self.n_true:
                self.n_true[rid] = n_host
            n = self.n_true[rid]
            placeholders = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            base = list(req.all_token_ids)  # the true tokens the host knows (outputs of t - 1)
            if req.is_finished() or n + q - placeholders > len(base):
                # finished while this step was in flight: it still runs, its states are junk
                self.dead_rows += 1
                seq = [("dead", rid)] * (n + q)
                rows.append((rid, n_host, q, seq, None, [], n))
                continue
            o = n + q - placeholders - req.num_prompt_tokens  # outputs before the drafts
            d = placeholders
            true = self.truth[rid][o:o + d] if o >= 0 else []
            a = int(self.rng.integers(0, d + 1)) if d else 0
            drafts = [t if j < a else -t - 1 for j, t in enumerate(true)]
            seq = base[:n + q - d] + drafts
            assert len(seq) == n + q, (rid, n, q, len(base), d)
            if placeholders:
                self.behind.append(n_host - n)
            rows.append((rid, n_host, q, seq, base, drafts, n))
        return sorted(rows, key=lambda r: r[2] > 1 + self.k)

    def _check_and_apply(self, g, rows):
        """spec_vllm_world's check with the true counts: the host gets the optimistic ones."""
        qsl = np.concatenate([[0], np.cumsum([r[2] for r in rows])])
        host_seq_lens = np.array([r[1] + r[2] for r in rows])
        true_seq_lens = host_seq_lens if self.optimistic else np.array(
            [r[6] + r[2] for r in rows])
        table = torch.zeros(len(rows), self.width, dtype=torch.int32)
        for i, (rid, *_) in enumerate(rows):
            ids = self.tables[rid][g]
            table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        drafts = np.array([len(r[5]) if r[5] and r[2] == len(r[5]) + 1 else -1 for r in rows])
        step = self.builders[g].build(qsl, host_seq_lens, table, len(rows), drafts=drafts,
                                      device_seq_lens=torch.tensor(true_seq_lens,
                                                                   dtype=torch.int32))
        true_rows = [(rid, n, q, seq, base, d) for rid, _, q, seq, base, d, n in rows]
        slots = self._slots(step, true_rows)
        writes = {}
        pool = self.sched.kv_cache_manager.block_pool
        for i, (rid, n, q, seq, base, _) in enumerate(true_rows):
            read, row_writes = slots[i]
            if base is not None and n:
                assert read >= 0 and self.content.get((g, read)) == tuple(base[:n]), \
                    f"{rid}: read slot {read} does not hold the state after n={n}"
            for m, page in row_writes:
                assert page not in writes, f"page {page} written twice in a step"
                assert all(page != s[0] for j, s in enumerate(slots) if j != i), \
                    f"{rid} writes page {page} that another row reads"
                writes[page] = tuple(seq[:m])
        for page, state in writes.items():
            self.content[(g, page)] = state

    def _verdict(self, rows):
        """The model runner's output: a verifying row samples its accepted drafts and one more
        true token; a row that completes its prompt samples the first true token."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids, sampled = [r[0] for r in rows], []
        for rid, n_host, q, seq, base, drafts, n in rows:
            req = self.reqs[rid]
            if base is None or n + q < req.num_prompt_tokens:
                sampled.append([])
                self.n_true[rid] = n + q
                continue
            o = n + q - len(drafts) - req.num_prompt_tokens
            a = next((j for j, t in enumerate(drafts) if t < 0), len(drafts))
            if drafts:
                self.accepted.append((len(drafts), a))
            sampled.append(self.truth[rid][o:o + a + 1])
            self.n_true[rid] = n + q - len(drafts) + a
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)

    def _check_cached(self):
        """As spec_vllm_world's, over every request the scheduler still has."""
        super()._check_cached()
