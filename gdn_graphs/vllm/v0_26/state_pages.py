"""vLLM 0.26: the GDN state pages of mode "all" -- what a request needs, what vLLM counts, and
which block-boundary states get a page.

vLLM's ``MambaSpec`` in mode "all" counts a page for every block up to max_model_len in each GDN
KV-cache group (for the capacity it logs and for its start-up check), and its ``MambaManager``
gives every block a step passes a page. A gdn_graphs request needs one page per GDN group to run:
its running state, which a step reads and writes in place when no other page can be spared (the
kernels allow a row to read the slot it writes). Everything else is optional:

* the page a step writes its final state to when it crosses a block boundary (so the state at
  the boundary stays cached) is a fresh page while the pool has slack, else the running page
  moves to the new column in place (the boundary's state is dropped from the cache); under
  async scheduling also where the rest of the prompt could not get its pages while the page a
  step in flight reads is held (``_short_ahead``);
* a checkpoint (the state at a boundary inside a prefill chunk) gets a page only from the slack,
  prompt ends first (the replay boundary vLLM hits when a prompt comes back), then the
  ``keep_states`` policy; a checkpoint without a page is a null block ("no slot").

* a state that served a prefix hit, the state at a shared-prefix junction (vLLM's
  ``request.shared_prefix_boundary``: the attention groups hit further than the GDN groups) and
  the request's latest passed boundary state are kept by the request while it runs, as it keeps
  the attention blocks before them: the next request on the same prefix (a system prompt) finds
  them however fast the LRU turns over; a request gives them back before it would go short of
  its own pages, and frees its latest boundary state last when it ends.

When a step would go short, the request gives back every page it keeps beyond its running page
(the above, and the checkpoints of a step still in flight under async scheduling, which it only
writes) to the cache, but never the page an in-flight step reads. A request whose whole sequence
leaves the pool less than a page per group beyond its own pages takes no GDN prefix hit: a hit
costs its page besides the page the request writes, which vLLM's full-sequence admission gate
counts, so that request would wait forever (its own states, cached when it was preempted, or a
previous run of its prompt, are what it would hit).

"Slack" is what the pool's free pages (evictable cached pages included) exceed a reserve by: the
pages the step's other running requests may still need (their remaining prompts' attention pages
up to a step's tokens, a page per group each). ``GDNStateSpec`` counts one page per group, ``GDNStateManager`` keeps to it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import weakref
from dataclasses import dataclass, field

from vllm.utils.math_utils import cdiv
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

__all__ = ["GDNStateSpec", "GDNStateManager", "PageStats", "state_spec", "keep_every", "register",
           "prefill_option"]

logger = logging.getLogger("vllm.gdn_graphs")

STATS_FILE_ENV = "GDN_GRAPHS_PAGE_STATS"  # a JSON snapshot of PageStats is written there


def keep_every(value) -> int:
    """The ``keep_states`` knob as a block interval: "all" -> 1 (every boundary), "ends" -> 0
    (prompt ends only), N >= 1 -> every N-th boundary (and prompt ends)."""
    if value in (None, "all"):
        return 1
    if value == "ends":
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"gdn_graphs keep_states must be 'all', 'ends' or a block count >= 1, "
                     f"got {value!r}")


def _options(vllm_config) -> dict:
    extra = getattr(vllm_config, "additional_config", None) or {}
    opts = extra.get("gdn_graphs") if isinstance(extra, dict) else None
    return opts if isinstance(opts, dict) else {}


PREFILL_OPTIONS = ("ours", "flashinfer")


def prefill_option(vllm_config) -> str:
    """The ``prefill`` option: "ours" (default: our chunk kernel) or "flashinfer" (FlashInfer's
    chunk kernel inside our contract where it runs: SM90, FlashInfer importable, fp32 state
    pool, K = V = 128, 64-aligned starts; ours elsewhere). Opt-in until it has run on a GPU."""
    value = _options(vllm_config).get("prefill", "ours")
    if value not in PREFILL_OPTIONS:
        raise ValueError(f"gdn_graphs prefill must be one of {PREFILL_OPTIONS}, got {value!r}")
    return value


@dataclass(frozen=True)
class GDNStateSpec(MambaSpec):
    """A GDN layer's pages in mode "all" with gdn_graphs: one page per request counted."""

    step_tokens: int = 0   # vllm_config.max_in_flight_tokens: tokens a step can have in flight
    keep_every: int = 1    # see keep_every()
    stats_every: int = 0   # log PageStats every this many steps (0: never)
    stats_interval_s: float = 10.0  # and at most this often by time while requests run (0: never)
    # Junction pages are written into the block list of the allocation that cache_blocks
    # follows; with a KV connector vLLM may delay that caching past the step (P/D loads), so
    # then they are not given.
    junctions: bool = True

    def max_memory_usage_bytes(self, vllm_config) -> int:
        # the running state; every other page is taken only from the slack (module docstring)
        return (1 + self.num_speculative_blocks) * self.page_size_bytes

    def max_num_blocks_per_req(self, vllm_config, max_len: int) -> int:
        # the block table is indexed by position over the whole sequence, as in mode "align"
        return cdiv(max_len, self.block_size) + self.num_speculative_blocks


def state_spec(spec: MambaSpec, vllm_config) -> GDNStateSpec:
    """Our spec for a GDN layer's mode-"all" MambaSpec, with this engine's knobs."""
    opts = _options(vllm_config)
    fields = {f: getattr(spec, f) for f in spec.__dataclass_fields__}
    ours = GDNStateSpec(**fields, step_tokens=vllm_config.max_in_flight_tokens,
                        keep_every=keep_every(opts.get("keep_states")),
                        stats_every=int(opts.get("stats_every", 0)),
                        stats_interval_s=float(opts.get("stats_interval_s", 10.0)),
                        junctions=getattr(vllm_config, "kv_transfer_config", None) is None)
    sc = getattr(vllm_config, "speculative_config", None)
    if sc is None:
        return ours
    from gdn_graphs.vllm.v0_26.spec_pages import spec_state_spec  # the lookahead layout's pages
    return spec_state_spec(ours, sc.num_speculative_tokens)


@dataclass
class PageStats:
    """GDN pages of one block pool, summed over its GDN groups (one per engine scheduler)."""

    held: int = 0              # pages running requests hold now
    peak_held: int = 0
    evictable: int = 0         # cached GDN pages nobody holds (at the last snapshot)
    hit_tokens: int = 0        # prefix-cache hit tokens of admitted requests
    hit_requests: int = 0
    admitted: int = 0
    in_place: int = 0          # boundary crossings that moved the running page (state dropped)
    ckpt_kept: int = 0         # checkpoints given a page
    ckpt_skipped: int = 0      # checkpoints left without one (policy or no slack)
    steps: int = 0
    managers: list = field(default_factory=list, repr=False)
    decisions: dict = field(default_factory=dict, repr=False)  # see GDNStateManager._shared
    junction_pages: int = 0    # shared-prefix junction states given a page (and kept)
    last_report: float = field(default_factory=time.monotonic, repr=False)

    def add_held(self, n: int) -> None:
        self.held += n
        self.peak_held = max(self.peak_held, self.held)

    def count_evictable(self) -> int:
        """Cached pages of these GDN groups that no request holds: one scan of the pool's cache
        (every cached block of every group), so only at a report."""
        if not self.managers:
            return 0
        suffixes = {m.kv_cache_group_id.to_bytes(4, "big") for m in self.managers}
        n = 0
        for key, entry in self.managers[0].block_pool.cached_block_hash_to_block._cache.items():
            if key[-4:] in suffixes:  # the group id ends the key (kv_cache_utils.get_group_id)
                n += (sum(b.ref_cnt == 0 for b in entry.values()) if isinstance(entry, dict)
                      else entry.ref_cnt == 0)
        return n

    def snapshot(self) -> dict:
        self.evictable = self.count_evictable()
        return {k: v for k, v in self.__dict__.items() if k not in ("managers", "decisions", "last_report")}

    def report(self) -> None:
        self.last_report = time.monotonic()
        snap = self.snapshot()
        logger.info("gdn_graphs: GDN pages held %d (peak %d), evictable %d; prefix hits %d tokens "
                    "in %d of %d requests; checkpoints kept %d, skipped %d; in place %d",
                    snap["held"], snap["peak_held"], snap["evictable"], snap["hit_tokens"],
                    snap["hit_requests"], snap["admitted"], snap["ckpt_kept"],
                    snap["ckpt_skipped"], snap["in_place"])
        path = os.environ.get(STATS_FILE_ENV)
        if path:
            with open(path, "w") as f:
                json.dump(snap, f)


_POOL_STATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pool_stats(block_pool) -> PageStats:
    """The PageStats of a block pool (shared by its GDN managers)."""
    stats = _POOL_STATS.get(block_pool)
    if stats is None:
        stats = _POOL_STATS[block_pool] = PageStats()
    return stats


class GDNStateManager(MambaManager):
    """vLLM's MambaManager (mode "all": lookups, caching, hashes) with gdn_graphs' page rules."""

    lookahead_layout = False  # speculative decoding's pages (spec_pages.GDNSpecStateManager)

    def __init__(self, kv_cache_spec: GDNStateSpec, block_pool, **kwargs) -> None:
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        if self.mamba_cache_mode != "all" or (self.num_speculative_blocks
                                              and not self.lookahead_layout):
            raise ValueError("GDNStateManager serves mode 'all' without speculative blocks "
                             "(GDNSpecStateManager serves them)")
        self.stats = pool_stats(block_pool)
        self.stats.managers.append(self)
        self._prompt_len: dict[str, int] = {}
        self._freed_upto: dict[str, int] = {}   # columns below this are null already
        self._in_place: dict[str, bool] = {}    # the plan of the last get_num_blocks_to_allocate
        self._pin: dict[str, set[int]] = {}     # columns a request keeps: its hit, a junction
        self._added: dict[str, tuple] = {}      # this step's (first column, the list returned)
        self._last: dict[str, int] = {}         # the column of its latest passed boundary state
        self._processed: dict[str, int] = {}    # tokens of finished steps (remove_skipped_blocks)
        self._seq_len: dict[str, int] = {}      # the request's tokens at its last allocation

    # ------------------------------------------------------------------------- prefix hits

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, *args, **kwargs):
        """vLLM's lookup, but no hit for a request that could not be admitted with one: a hit
        holds its state's page in each GDN group besides the page the request writes, and
        vLLM's full-sequence gate counts both (``get_num_blocks_to_allocate``), so where the
        request's whole sequence (its attention pages, one attention group as in
        ``_reserve``) plus that leaves the pool (all but the null block) less than a page per
        group, it would wait for ever, also in an empty pool. Without the hit (the attention
        groups then recompute too) the gate counts the one page per group it runs with."""
        hit = super().find_longest_cache_hit(block_hashes, max_length, kv_cache_group_ids,
                                             block_pool, kv_cache_spec, *args, **kwargs)
        if not hit[1]:
            return hit
        raw = (block_hashes.block_hashes if isinstance(block_hashes, BlockHashListWithBlockSize)
               else block_hashes)  # the request's hashes, one per hash block of its tokens
        tokens = (len(raw) + 1) * block_pool.hash_block_size - 1  # at most (a partial block)
        n = len(kv_cache_group_ids)
        need = (cdiv(tokens, kv_cache_spec.block_size)
                + n * (1 + kv_cache_spec.num_speculative_blocks) + n)
        if need > block_pool.num_gpu_blocks - 1:
            return tuple([] for _ in kv_cache_group_ids), 0
        return hit

    # ---------------------------------------------------------------------- what a step takes

    def _reserve(self, request_id) -> int:
        """Free pages left alone for what the step's other running requests may still take
        before their turn (a waiting request that finds none just waits; a running one would be
        preempted): the attention pages of their remaining prompts, up to a step's tokens, and
        a page per group each (groups: the GDN groups of this pool plus one attention group)."""
        groups = len(self.stats.managers) + 1
        prefill = sum(max(self._prompt_len.get(rid, 0) - len(blocks) * self.block_size, 0)
                      for rid, blocks in self.req_to_blocks.items() if rid != request_id)
        step = min(self.kv_cache_spec.step_tokens, prefill)
        return cdiv(step, self.block_size) + groups * (len(self.req_to_blocks) + 1)

    def _slack(self, request_id, first: int, end: int) -> int:
        """Free pages beyond the reserve and this request's own pages of the step in the other
        groups: attention for its new columns (counted even if already taken: safe), a write
        page in each other GDN group."""
        own = (end - first) + len(self.stats.managers) - 1
        return self.block_pool.get_num_free_blocks() - self._reserve(request_id) - own

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens, num_local_computed_tokens,
                                   num_tokens_main_model, apply_admission_cap=False) -> int:
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step:
            return self.block_pool.num_gpu_blocks + 1  # as MambaManager: written this step
        held = self.req_to_blocks.get(request_id, ())
        evictable = self._get_num_evictable_blocks(new_computed_blocks)
        if cdiv(num_tokens, self.block_size) <= len(held) + len(new_computed_blocks):
            self._in_place.pop(request_id, None)
            return evictable
        # Only a running request's own page moves: a hit page is a cached state other requests
        # may want (a system prompt's), and a page someone else holds is read by them.
        private = (not new_computed_blocks and bool(held) and not held[-1].is_null
                   and held[-1].ref_cnt == 1)
        first, end = len(held) + len(new_computed_blocks), cdiv(num_tokens, self.block_size)
        if held:  # its kept pages go back (every group's at once) before the request goes short
            self._shared("unpin", request_id, (first, end),
                         lambda: self._give_back_if_short(request_id, first, end))
        # one answer for every group: in place or not decides which columns keep a page
        in_place = self._shared("in_place", request_id, (first, end), lambda: (
            self._slack(request_id, first, end) < 1
            or self._short_ahead(request_id, end, total_computed_tokens))) and private
        self._in_place[request_id] = in_place
        return evictable + (0 if in_place else 1)

    def _short_ahead(self, request_id, end: int, computed: int) -> bool:
        """With a step of the request in flight (async scheduling), whether its later chunks
        could not be given their pages if this one kept the page it reads: the next allocation
        comes while this step is in flight, and the page this step reads stays held till then.
        Moving in place carries no page over, so the request's whole prompt then needs its
        attention columns and a page per group, which the start-up check guarantees for a
        request alone in the pool; kept, it would need a page per group more (at the edge of
        the pool it would be preempted and recompute for ever). Counted against the free pages
        and the request's own (attention columns, unshared GDN pages: it gives them back)."""
        if self._processed.get(request_id, computed) >= computed:
            return False  # nothing in flight: the page this step reads is freed before the next
        cols = cdiv(max(self._prompt_len.get(request_id, 0), self._seq_len.get(request_id, 0)),
                    self.block_size)
        if cols <= end:
            return False  # the prompt ends in this step
        own = len(self.req_to_blocks[request_id]) + sum(
            not b.is_null and b.ref_cnt == 1 for m in self.stats.managers
            for b in m.req_to_blocks.get(request_id, ()))
        return cols + 2 * len(self.stats.managers) > self.block_pool.get_num_free_blocks() + own

    def _give_back_if_short(self, request_id, first: int, end: int) -> bool:
        """If the free pages do not cover the step's new attention columns and a page per GDN
        group, every group gives back the pages the request keeps (``_unpin``)."""
        if not self._kept_cols(request_id) or (self.block_pool.get_num_free_blocks()
                                                >= (end - first) + len(self.stats.managers)):
            return False
        for m in self.stats.managers:
            if request_id in m.req_to_blocks:
                m._unpin(request_id)
        return True

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        blocks = self.req_to_blocks[request_id]
        first, end = len(blocks), cdiv(num_tokens, self.block_size)
        if end <= first:
            return []
        if request_id not in self._freed_upto:  # admitted without a prefix hit
            self._admitted(request_id, 0)
        in_place = (self._in_place.pop(request_id, False) and blocks and not blocks[-1].is_null
                    and blocks[-1].ref_cnt == 1)
        keep = self._keep(request_id, first, end)
        new = self.block_pool.get_new_blocks(len(keep) + (0 if in_place else 1))
        if in_place:
            write = blocks[-1]
            blocks[-1] = self._null_block
            self.block_pool._maybe_evict_cached_block(write)  # its state is about to change
            self.stats.in_place += 1
        else:
            write = new.pop()
        pages = iter(new)
        added = [next(pages) if j in keep else self._null_block for j in range(first, end - 1)]
        added.append(write)
        blocks.extend(added)
        self._added[request_id] = (first, added)
        self.stats.ckpt_kept += len(keep)
        self.stats.ckpt_skipped += end - 1 - first - len(keep)
        self.stats.add_held(len(keep) + (0 if in_place else 1))
        return added

    def _shared(self, kind: str, request_id, key, decide):
        """One decision for every GDN group of the pool in one vLLM call (a hit needs each
        group's state at one boundary): the first group to ask runs ``decide()``, the others
        get its answer while ``key`` is the same."""
        slot = (kind, request_id)
        d = self.stats.decisions.get(slot)
        if d is None or d[0] != key:
            d = self.stats.decisions[slot] = [key, decide(), len(self.stats.managers)]
        d[2] -= 1
        if d[2] == 0:
            del self.stats.decisions[slot]
        return d[1]

    def _keep(self, request_id, first: int, end: int) -> set[int]:
        """The checkpoint columns of this step that get a page, sharing the slack equally; the
        replay boundary (the end of the prompt: what a returning prompt and, when the output
        crosses no boundary, the next turn start from) needs only a page per group beyond every
        running request's next page and this request's own."""
        def decide():
            n = len(self.stats.managers)
            wanted = self._checkpoints(request_id, first, end - 1)
            keep = set(wanted[:max((self._slack(request_id, first, end) - 1) // n, 0)])
            replay = self._replay_col(request_id)
            if replay in wanted and replay not in keep:
                own = (end - first) + n
                if (self.block_pool.get_num_free_blocks() - own
                        - (n + 1) * (len(self.req_to_blocks) + 1)) >= n:
                    keep.add(replay)
            return keep
        return self._shared("keep", request_id, (first, end), decide)

    def _read_col(self, request_id) -> int:
        """The column whose state the request's oldest unfinished step reads (the state after
        its finished steps' tokens); -1 when that is none."""
        return (self._processed.get(request_id, 0) - 1) // self.block_size

    def _kept_cols(self, request_id) -> list[int]:
        """Columns of pages the request holds but no step of it reads: all before its running
        page but the one an in-flight step reads (its hit and junction states, its latest
        boundary state, and under async scheduling the checkpoints of a step in flight, which
        that step only writes)."""
        blocks = self.req_to_blocks.get(request_id, ())
        read = self._read_col(request_id)
        return [j for j in range(len(blocks) - 1) if not blocks[j].is_null and j != read]

    def _unpin(self, request_id) -> None:
        """Back to the cache (evictable, still findable) with the pages the request kept
        (``_kept_cols``), tail first, the prompt's replay boundary last (the LRU evicts in that
        order); a page another request holds just loses this request's reference."""
        blocks = self.req_to_blocks.get(request_id)
        cols = self._kept_cols(request_id)
        self._pin.pop(request_id, None)
        self._last.pop(request_id, None)
        if not cols:
            return
        replay = self._replay_col(request_id)
        cols.sort(key=lambda j: (j == replay, -j))
        freed = [blocks[j] for j in cols]
        for j in cols:
            blocks[j] = self._null_block
        self.block_pool.free_blocks(freed)
        self.stats.add_held(-len(freed))

    def _replay_col(self, request_id) -> int:
        """The column holding the state a returning prompt hits (vLLM caps hits at prompt - 1)."""
        p = self._prompt_len.get(request_id, 0)
        return (p - 1) // self.block_size - 1

    def _checkpoints(self, request_id, lo: int, hi: int) -> list[int]:
        """Columns in [lo, hi) that want a checkpoint page, most wanted first: the prompt's
        replay boundary, then the policy's boundaries, latest first (longer hits)."""
        replay = self._replay_col(request_id)
        every = self.kv_cache_spec.keep_every
        cols = [j for j in range(hi - 1, lo - 1, -1) if every and (j + 1) % every == 0
                and j != replay]
        return ([replay] if lo <= replay < hi else []) + cols

    def cache_blocks(self, request, num_tokens, retention_interval=None) -> None:
        """vLLM's caching, after giving the step's shared-prefix junction a page: vLLM sets
        ``request.shared_prefix_boundary`` where the attention groups hit further than the GDN
        groups (an uncached shared prefix: another request's system prompt), which the
        allocation could not see. The page goes into this step's new columns (the list the
        allocation returned, which becomes the step's block ids), the same in every GDN group,
        and the request keeps it while it runs: the next request on that prefix hits it."""
        rid = request.request_id
        self._seq_len[rid] = request.num_tokens
        if rid in self._added:  # (a step that added no column has no junction to fill: decode)
            self._fill_junction(request)
        super().cache_blocks(request, num_tokens, retention_interval=retention_interval)

    def _fill_junction(self, request) -> None:
        rid = request.request_id
        first, added = self._added.pop(rid, (0, None))
        if not self.kv_cache_spec.junctions:
            return
        boundary = getattr(request, "shared_prefix_boundary", 0) or 0
        col = boundary // self.block_size - 1
        if added is None or not first <= col < first + len(added) - 1:
            return
        if not added[col - first].is_null:
            self._pin.setdefault(rid, set()).add(col)
            return
        n = len(self.stats.managers)
        if not self._shared("junction", rid, col, lambda: self.block_pool.get_num_free_blocks()
                            - self._reserve(rid) >= n):
            return
        page = self.block_pool.get_new_blocks(1)[0]
        added[col - first] = self.req_to_blocks[rid][col] = page
        self._pin.setdefault(rid, set()).add(col)
        self.stats.add_held(1)
        if self is self.stats.managers[0]:
            self.stats.junction_pages += 1

    # --------------------------------------------------------------------- what a step gives back

    def add_local_computed_blocks(self, request_id, new_computed_blocks,
                                  num_local_computed_tokens, num_external_computed_tokens) -> None:
        super().add_local_computed_blocks(request_id, new_computed_blocks,
                                          num_local_computed_tokens, num_external_computed_tokens)
        blocks = self.req_to_blocks[request_id]
        self.stats.add_held(sum(not b.is_null for b in blocks))
        self._admitted(request_id, num_local_computed_tokens)
        self._freed_upto[request_id] = max(len(blocks) - 1, 0)
        if blocks and not blocks[-1].is_null:
            # A state that served a hit is a proven branch point (a system prompt's end): the
            # request keeps it while it runs, as it keeps the attention blocks before it, so
            # the next request on the same prefix finds it however fast the LRU turns over.
            self._pin.setdefault(request_id, set()).add(len(blocks) - 1)

    def _admitted(self, request_id, hit_tokens: int) -> None:
        self._freed_upto[request_id] = 0
        if self is self.stats.managers[0]:  # one count per request, not per group
            self.stats.admitted += 1
            if hit_tokens:
                self.stats.hit_requests += 1
                self.stats.hit_tokens += hit_tokens

    def remove_skipped_blocks(self, request_id, processed_computed_tokens,
                              num_prompt_tokens=None) -> None:
        """Frees the pages of columns before the one the next step reads. Unlike vLLM's, it does
        not stop at a null column (checkpoints without a page leave gaps); prompt-end pages go to
        the free queue last, so the LRU evicts them last."""
        if num_prompt_tokens is not None:
            self._prompt_len[request_id] = num_prompt_tokens
        if request_id in self.req_to_blocks:
            self._processed[request_id] = processed_computed_tokens
        blocks = self.req_to_blocks.get(request_id)
        if not blocks or processed_computed_tokens <= 0:
            return
        upto = min((processed_computed_tokens - 1) // self.block_size, len(blocks))
        lo = self._freed_upto.get(request_id, 0)
        if upto <= lo:
            return
        replay, pins = self._replay_col(request_id), self._pin.get(request_id, ())
        # the latest boundary state passed stays until a later one replaces it: when the
        # request ends it is the state its next turn starts from
        old = self._last.get(request_id)
        keep = next((j for j in range(upto - 1, lo - 1, -1)
                     if not blocks[j].is_null and j not in pins), old)
        cols = [j for j in range(lo, upto) if not blocks[j].is_null and j not in pins and j != keep]
        if old is not None and old != keep and not blocks[old].is_null and old not in pins:
            cols.append(old)
        if keep is not None:
            self._last[request_id] = keep
        cols.sort(key=lambda j: (j == replay, -j))  # vLLM's order (tail first), prompt end last
        freed = [blocks[j] for j in cols]
        for j in cols:
            blocks[j] = self._null_block
        self._freed_upto[request_id] = upto
        if freed:
            self.block_pool.free_blocks(freed)
            self.stats.add_held(-len(freed))

    def free(self, request_id) -> None:
        """vLLM's order (tail first: the LRU evicts it first), but the request's latest boundary
        state last: of its pages, the one a next turn needs."""
        blocks = self.req_to_blocks.get(request_id, ())
        col = self._last.get(request_id)
        last = blocks[col] if col is not None and col < len(blocks) else None
        popped = self.pop_blocks_for_free(request_id)
        order = [b for b in reversed(popped) if b is not last]
        self.block_pool.free_blocks(order + ([last] if last is not None else []))

    def pop_blocks_for_free(self, request_id):
        for d in (self._prompt_len, self._freed_upto, self._in_place, self._pin, self._added,
                  self._last, self._processed, self._seq_len):
            d.pop(request_id, None)
        for kind in ("keep", "junction", "unpin", "in_place"):
            self.stats.decisions.pop((kind, request_id), None)
        blocks = super().pop_blocks_for_free(request_id)
        self.stats.add_held(-sum(not b.is_null for b in blocks))
        if (os.environ.get(STATS_FILE_ENV) and self is self.stats.managers[-1]
                and not any(m.req_to_blocks for m in self.stats.managers)):
            self.stats.report()  # idle: the snapshot on disk is final until the next request
        return blocks

    # ------------------------------------------------------------------------------------ stats

    def new_step_starts(self) -> None:
        super().new_step_starts()
        stats = self.stats
        if self is not stats.managers[0]:
            return
        stats.steps += 1
        spec = self.kv_cache_spec
        if spec.stats_every and stats.steps % spec.stats_every == 0:
            stats.report()
        elif (spec.stats_interval_s and stats.held
              and time.monotonic() - stats.last_report >= spec.stats_interval_s):
            stats.report()


def _count_the_null_block(fn):
    """vLLM's start-up check and its max_model_len auto-fit ask whether one request of
    max_model_len fits the pool (``_max_memory_usage_bytes_from_groups``), but the pool's first
    page is the null block, which is never handed out. vLLM's own GDN specs count two pages per
    group ("align") where a request is admitted with one, which leaves room for it; ours counts
    exactly what a request takes, one per group, so without this page a request within a page of
    max_model_len would wait forever at vLLM's full-sequence admission gate (a pool sized at the
    edge: seen on the CPU with vLLM's scheduler). Added once per pool, only where a group is ours."""
    @functools.wraps(fn)
    def wrapped(vllm_config, kv_cache_groups):
        need = fn(vllm_config, kv_cache_groups)
        if need and any(isinstance(g.kv_cache_spec, GDNStateSpec) for g in kv_cache_groups):
            group_size = max(len(g.layer_names) for g in kv_cache_groups)
            need += group_size * max(g.kv_cache_spec.page_size_bytes for g in kv_cache_groups)
        return need

    wrapped._gdn_graphs = True
    return wrapped


def register() -> None:
    """Registers GDNStateSpec -> GDNStateManager with vLLM's KV-cache spec registry (vLLM's
    built-in specs first: the registry fills itself only while it is empty), and makes vLLM's
    one-request memory count include the null block where our spec is used (idempotent)."""
    KVCacheSpecRegistry._ensure_registered()
    KVCacheSpecRegistry.register(GDNStateSpec, GDNStateManager, uniform_type_base_spec=MambaSpec)
    fn = kv_cache_utils._max_memory_usage_bytes_from_groups
    if not getattr(fn, "_gdn_graphs", False):
        kv_cache_utils._max_memory_usage_bytes_from_groups = _count_the_null_block(fn)


register()
