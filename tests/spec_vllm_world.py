"""A vLLM 0.26 engine with speculative decoding reduced to its KV-cache side, for the CPU tier:
vLLM's own Scheduler (ngram config, k drafts) with the plugin's GDN pages, a worker-side block
table per GDN group fed from the scheduler's output as vLLM's worker appends it, the plugin's
StepBuilder on those tables, and an oracle of what every GDN page holds.

The oracle names a state by the tokens it has seen (the state after m tokens of a sequence is
``tuple(sequence[:m])``): each step, every slot a row's kernels would write gets the state they
would store there (the row's tokens are the request's own, then its drafts), and every slot a
row reads must hold the state after the request's true computed tokens. Pages that vLLM's prefix
cache holds (a block hash) must hold the state of their block's true tokens whenever looked at,
whatever drafts were rejected since. Drafts and the model's verdicts come from a per-request
"true" continuation: a row accepts the drafts up to the first that differs from it.
"""

from __future__ import annotations

import numpy as np
import torch

from test_vllm_plugin import _engine_config, _final_block_size
from test_vllm_state_pages import B, request, specs


def spec_scheduler(path, num_blocks, k):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from gdn_graphs.vllm.v0_26.spec_pages import spec_state_spec

    cfg = _engine_config(path, enable_prefix_caching=True, block_size=16, max_num_seqs=8,
                         max_num_batched_tokens=1024, max_model_len=8192,
                         speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                             "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    _final_block_size(cfg)
    assert cfg.cache_config.block_size == B and cfg.scheduler_config.async_scheduling is False
    cfg.cache_config.num_gpu_blocks = num_blocks
    attn, gdn = specs(step_tokens=cfg.max_in_flight_tokens)
    gdn = spec_state_spec(gdn, k)
    groups = [KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)] + [
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn"], gdn) for i in range(3)]
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    sched = Scheduler(cfg, kvc, StructuredOutputManager(cfg), block_size=B, log_stats=True)
    return sched, cfg, gdn


class SpecWorld:
    """Drives the scheduler step by step and checks every slot the builder hands the kernels."""

    def __init__(self, path, num_blocks, k, seed=0):
        from gdn_graphs.vllm.builder import GDNResources, StepBuilder

        self.sched, cfg, gdn = spec_scheduler(path, num_blocks, k)
        self.k, self.rng = k, np.random.default_rng(seed)
        self.width = gdn.max_num_blocks_per_req(cfg, cfg.model_config.max_model_len)
        res = GDNResources(max_reqs=8, max_tokens=1024, num_spec_tokens=k)
        self.builders = [StepBuilder(res, B, self.width, 0, torch.device("cpu")) for _ in range(3)]
        self.tables: dict[str, list[list[int]]] = {}
        self.content: dict[tuple[int, int], tuple] = {}   # (group, page) -> state (tokens seen)
        self.cached: dict[tuple[int, int], tuple] = {}    # (group, page) -> (hash, state)
        self.truth: dict[str, list[int]] = {}             # request -> its true outputs
        self.accepted: list[tuple[int, int]] = []         # (drafts, accepted) of each spec row
        self.hits: dict[str, int] = {}
        self.steps = self.preempted = 0

    # ------------------------------------------------------------------------------ requests

    def add(self, rid, prompt, max_tokens):
        self.truth[rid] = self.rng.integers(10, 4000, max_tokens + self.k + 1).tolist()
        req = request(rid, prompt, max_tokens=max_tokens)
        self.sched.add_request(req)
        return req

    # --------------------------------------------------------------------------------- a step

    def step(self):
        out = self.sched.schedule()
        self.steps += 1
        self.preempted += len(out.preempted_req_ids or ())
        if not out.num_scheduled_tokens:
            return out
        self._update_tables(out)
        rows = self._rows(out)
        for g in range(3):
            self._check_and_apply(g, rows)
        self._finish(out, rows)
        self._check_cached()
        return out

    def _update_tables(self, out):
        for nr in out.scheduled_new_reqs:
            self.tables[nr.req_id] = [list(ids) for ids in nr.block_ids[1:]]
            self.hits.setdefault(nr.req_id, nr.num_computed_tokens)
        cd = out.scheduled_cached_reqs
        for i, rid in enumerate(cd.req_ids):
            new = cd.new_block_ids[i]
            if rid in cd.resumed_req_ids:
                self.tables[rid] = [list(ids) for ids in new[1:]]
            elif new is not None:
                for g in range(3):
                    self.tables[rid][g].extend(new[1 + g])

    def _rows(self, out):
        """(rid, n, q, tokens of the row's sequence) in vLLM's order: rows of up to 1 + k tokens
        first (reorder_batch_threshold), then the rest."""
        computed = {nr.req_id: nr.num_computed_tokens for nr in out.scheduled_new_reqs}
        cd = out.scheduled_cached_reqs
        computed.update(zip(cd.req_ids, cd.num_computed_tokens))
        rows = []
        for rid, q in out.num_scheduled_tokens.items():
            n = computed[rid]
            req = self.sched.requests[rid]
            base = list(req.all_token_ids)
            drafts = list(out.scheduled_spec_decode_tokens.get(rid, ()))
            seq = base[:n + q] if n + q <= len(base) else base + drafts
            assert len(seq) == n + q, (rid, n, q, len(base), drafts)
            rows.append((rid, n, q, seq, base, drafts))
        return sorted(rows, key=lambda r: r[2] > 1 + self.k)  # stable

    def _check_and_apply(self, g, rows):
        qsl = np.concatenate([[0], np.cumsum([r[2] for r in rows])])
        seq_lens = np.array([r[1] + r[2] for r in rows])
        table = torch.zeros(len(rows), self.width, dtype=torch.int32)
        for i, (rid, *_) in enumerate(rows):
            ids = self.tables[rid][g]
            table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        # what vLLM's model runner passes as num_decode_draft_tokens_cpu
        drafts = np.array([len(r[5]) if r[5] and r[2] == len(r[5]) + 1 else -1 for r in rows])
        step = self.builders[g].build(qsl, seq_lens, table, len(rows), drafts=drafts)
        slots = self._slots(step, rows)
        writes = {}
        for i, (rid, n, q, seq, base, drafts) in enumerate(rows):
            read, row_writes = slots[i]
            if n == 0:
                assert read == -1, (rid, read)
            else:
                assert read >= 0 and self.content.get((g, read)) == tuple(base[:n]), \
                    f"{rid}: read slot {read} does not hold the state after n={n}"
            for m, page in row_writes:
                assert page not in writes, f"page {page} written twice in a step"
                assert all(page != s[0] for j, s in enumerate(slots) if j != i), \
                    f"{rid} writes page {page} that another row reads"
                blk = self.sched.kv_cache_manager.block_pool.blocks[page]
                if blk.block_hash is not None:  # the prefix cache holds it: only its true state
                    assert m <= len(base) and m % B == 0, f"{rid}: writes draft state {m} into " \
                                                         f"cached page {page}"
                writes[page] = tuple(seq[:m])
        for page, state in writes.items():
            self.content[(g, page)] = state

    def _slots(self, step, rows):
        """Per row: (read slot, [(m, slot) for every state it stores]), as the kernels get them."""
        out = []
        assert step.num_decodes == 0  # with speculation every short row is a spec row
        for i in range(step.num_spec):
            rid, n, q = rows[i][:3]
            ws = step.spec_write[i, :q].tolist()
            out.append((int(step.spec_read[i]), [(n + 1 + t, s) for t, s in enumerate(ws)
                                                 if s >= 0]))
            assert len(out[-1][1]) == q, f"{rid}: a spec row stores the state after every token"
        pre = step.prefill
        for j in range(len(rows) - step.num_spec):
            rid, n, q = rows[step.num_spec + j][:3]
            stores = [(n + q, int(pre.write_slot[j]))]
            lo, hi = int(pre.ckpt_offsets[j]), int(pre.ckpt_offsets[j + 1])
            first = (n // B + 1) * B
            stores += [(first + e * B, int(s)) for e, s in enumerate(pre.ckpt_slots[lo:hi])
                       if s >= 0]
            out.append((int(pre.read_slot[j]), stores))
        return out

    def _finish(self, out, rows):
        """The model's verdict: a row that completes its prompt samples the first true token; a
        spec row accepts its drafts up to the first that differs from the truth."""
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        ids = [r[0] for r in rows]
        sampled = []
        for rid, n, q, seq, base, drafts in rows:
            req = self.sched.requests[rid]
            if n + q < req.num_prompt_tokens:
                sampled.append([])
                continue
            o = len(req.output_token_ids)
            true = self.truth[rid][o:o + len(drafts) + 1]
            a = next((j for j, d in enumerate(drafts) if d != true[j]), len(drafts))
            if drafts:
                self.accepted.append((len(drafts), a))
            sampled.append(true[:a + 1])
        self.sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled))
        drafts = {rid: self._drafts(rid) for rid in ids if rid in self.sched.requests}
        self.sched.update_draft_token_ids(DraftTokenIds(list(drafts), list(drafts.values())))

    def _drafts(self, rid):
        """k drafts (sometimes fewer) of which the first ``a`` are right, ``a`` cycling 0..k."""
        req = self.sched.requests[rid]
        o = len(req.output_token_ids)
        if not o:
            return []
        d = self.k if self.rng.random() < 0.7 else int(self.rng.integers(1, self.k + 1))
        a = (self.steps + len(rid)) % (self.k + 1)
        true = self.truth[rid][o:o + d]
        return [t if j < a else t + 1 for j, t in enumerate(true)]

    def _check_cached(self):
        """Every page the prefix cache holds holds its block's true state (recorded the first
        time it is seen with a hash in a running request's table)."""
        kvm = self.sched.kv_cache_manager
        pool = kvm.block_pool
        managers = kvm.coordinator.single_type_managers[1:]  # the GDN groups, in order
        for rid, req in self.sched.requests.items():
            for g, m in enumerate(managers):
                for c, blk in enumerate(m.req_to_blocks.get(rid, ())):
                    page = blk.block_id
                    hashed = not blk.is_null and blk.block_hash is not None
                    if hashed and (g, page) not in self.cached:
                        self.cached[(g, page)] = (blk.block_hash,
                                                  tuple(req.all_token_ids[:(c + 1) * B]))
        for (g, page), (h, state) in list(self.cached.items()):
            if pool.blocks[page].block_hash != h:
                del self.cached[(g, page)]  # evicted and reused: no longer a cached state
            elif self.content.get((g, page)) != state:
                raise AssertionError(f"cached page {page} of group {g} lost its block's state")

    def run(self, max_steps=4000):
        while self.sched.has_unfinished_requests():
            self.step()
            assert self.steps < max_steps, "did not finish"
