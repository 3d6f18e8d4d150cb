"""vLLM 0.26: the GDN pages of mode "all" with speculative decoding (the lookahead layout).

With k drafts per step a request's state after m tokens lives, by m alone, in its block table's
column m // B - 1 at a block boundary and in one of the R = k + 1 columns after the block holding
token m - 1 otherwise (``gdn_graphs.runtime.step.lookahead_column``; README "Conventions"). So
every column from the block of a step's last token to R columns past it must hold a private
page: ``GDNSpecStateManager`` gives a request those pages (R + 1 per GDN group: the spec counts
``1 + num_speculative_blocks``) and keeps every other rule of ``GDNStateManager`` (checkpoints
inside a prefill chunk from the slack, hit, junction and latest boundary states kept). A running
page never moves in place here: the pages ahead already hold states a step may read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

from gdn_graphs.vllm.builder import spec_lookahead
from gdn_graphs.vllm.v0_26.state_pages import GDNStateManager, GDNStateSpec

__all__ = ["GDNSpecStateSpec", "GDNSpecStateManager", "spec_state_spec"]


@dataclass(frozen=True)
class GDNSpecStateSpec(GDNStateSpec):
    """GDNStateSpec with ``num_speculative_blocks`` = R, the lookahead columns (k + 1)."""


def spec_state_spec(spec: GDNStateSpec, num_spec_tokens: int) -> GDNSpecStateSpec:
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    values["num_speculative_blocks"] = spec_lookahead(num_spec_tokens)
    return GDNSpecStateSpec(**values)


class GDNSpecStateManager(GDNStateManager):
    """GDNStateManager for the lookahead layout: a step ending at N tokens (drafts included)
    holds private pages in columns (N - 1) // B .. cdiv(N, B) + R - 1."""

    lookahead_layout = True

    def __init__(self, kv_cache_spec, block_pool, **kwargs) -> None:
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        self._private: dict[str, int] = {}  # the first private column of the last allocation

    def _end(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size) + self.num_speculative_blocks

    def _first_private(self, num_tokens_main_model: int) -> int:
        """The first column that must hold a page: the block of the step's last token (every
        state the step or the next one reads or stores lies there or after, or at a boundary
        whose page an earlier step allocated as private)."""
        return max(num_tokens_main_model - 1, 0) // self.block_size

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens, num_local_computed_tokens,
                                   num_tokens_main_model, apply_admission_cap=False) -> int:
        if (new_computed_blocks
                and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step):
            return self.block_pool.num_gpu_blocks + 1  # as MambaManager: written this step
        held = self.req_to_blocks.get(request_id, ())
        evictable = self._get_num_evictable_blocks(new_computed_blocks)
        first, end = len(held) + len(new_computed_blocks), self._end(num_tokens)
        if end <= first:
            return evictable
        private = end - max(first, self._first_private(num_tokens_main_model))
        if held and (self._pin.get(request_id) or request_id in self._last) and self._shared(
                "unpin", request_id, (first, end), lambda: self.block_pool.get_num_free_blocks()
                < private * len(self.stats.managers) + (end - first)):
            self._unpin(request_id)  # its kept pages go back before the request goes short
        return evictable + private

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        blocks = self.req_to_blocks[request_id]
        first, end = len(blocks), self._end(num_tokens)
        if end <= first:
            return []
        if request_id not in self._freed_upto:  # admitted without a prefix hit
            self._admitted(request_id, 0)
        private = max(first, self._first_private(num_tokens_main_model))
        keep = self._spec_keep(request_id, first, private, end)
        pages = iter(self.block_pool.get_new_blocks(len(keep) + end - private))
        added = [next(pages) if j in keep or j >= private else self._null_block
                 for j in range(first, end)]
        blocks.extend(added)
        self._added[request_id] = (first, added)
        self._private[request_id] = private
        self.stats.ckpt_kept += len(keep)
        self.stats.ckpt_skipped += private - first - len(keep)
        self.stats.add_held(len(keep) + end - private)
        return added

    def _spec_keep(self, request_id, first: int, private: int, end: int) -> set[int]:
        """The checkpoint columns (boundaries inside a prefill chunk, before the private ones)
        that get a page: only from the slack left once every GDN group has this step's private
        pages and attention its new columns (counted as many as ours: safe), shared equally by
        the groups; the same in every group (``_shared``)."""
        def decide():
            n = len(self.stats.managers)
            wanted = self._checkpoints(request_id, first, private)
            slack = (self.block_pool.get_num_free_blocks() - self._reserve(request_id)
                     - (end - first) - n * (end - private))
            return set(wanted[:max(slack // n, 0)])
        return self._shared("keep", request_id, (first, end), decide)

    def _fill_junction(self, request) -> None:
        """A junction page only in a checkpoint column (a private page is not the request's to
        keep: it is rewritten as the request moves on)."""
        rid = request.request_id
        boundary = getattr(request, "shared_prefix_boundary", 0) or 0
        if boundary // self.block_size - 1 >= self._private.get(rid, 0) and rid in self._added:
            self._added.pop(rid)
            return
        super()._fill_junction(request)

    def pop_blocks_for_free(self, request_id):
        self._private.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def _unpin(self, request_id) -> None:
        """As GDNStateManager's, for the columns the request has passed only."""
        blocks = self.req_to_blocks.get(request_id)
        passed = self._freed_upto.get(request_id, 0)
        pins = self._pin.get(request_id, set())
        cols = {c for c in pins if c < passed}
        self._pin[request_id] = pins - cols
        if self._last.get(request_id, passed) < passed:
            cols.add(self._last.pop(request_id))
        for col in cols:
            if blocks and not blocks[col].is_null:
                page, blocks[col] = blocks[col], self._null_block
                self.block_pool.free_blocks([page])
                self.stats.add_held(-1)


def register() -> None:
    """GDNSpecStateSpec -> GDNSpecStateManager in vLLM's KV-cache spec registry."""
    KVCacheSpecRegistry._ensure_registered()
    KVCacheSpecRegistry.register(GDNSpecStateSpec, GDNSpecStateManager,
                                 uniform_type_base_spec=MambaSpec)


register()
