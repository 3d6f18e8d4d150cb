"""State slots and the block-level prefix cache: which pool slot holds which state.

Kernels see only slot numbers. This module decides them, on the host, per request:

* ``StatePool`` hands out slot indices of the per-layer pools (``ssm[num_slots, ...]``,
  ``conv[num_slots, ...]``) from a free list. A slot is the same index in every layer's pool.
* ``PrefixCache`` maps each request's blocks (block b = tokens [b*B, (b+1)*B)) to slots. The slot
  of block b holds the state after (b+1)*B tokens once the request has computed that far (while
  the request is inside block b it holds the running state). Full blocks are identified by a
  chained hash: hash(parent hash, token ids of the block), so an equal block at a different prefix
  gets a different hash. A block whose end the request's computed tokens have passed is
  *committed*: registered under its hash, never written again by its request, and readable by
  any later request whose tokens hash the same.

Lifetime of a slot with caching on: fresh (owned by one request, uncached) -> committed (cached,
ref count = requests using it) -> ref count 0: kept, evictable, in LRU order -> evicted when a
request needs a fresh slot and the free list is empty (its hash is forgotten, its slot reused).
A request that hits a cached block only reads its slot (reads the state after its last hit block);
every block it computes gets a fresh slot, so shared states are never overwritten.

With caching off a request owns exactly one slot and its block table is that slot repeated (the
planner drops checkpoints equal to the write slot, so the kernels keep only the running state).

Errors: running out of slots raises ``OutOfSlots`` for the request that asked, *before* anything is
changed (counts are checked first, then mutations happen), so other requests are never affected.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Sequence

try:  # xxh3 is fast and has 64-bit output; hashlib is the fallback (same chaining, slower)
    import xxhash

    def _hash_bytes(data: bytes) -> int:
        return xxhash.xxh3_64_intdigest(data)
except ImportError:  # pragma: no cover - xxhash is a declared dependency
    import hashlib

    def _hash_bytes(data: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")

import numpy as np

ROOT_HASH = 0x9E3779B97F4A7C15  # parent of the first block: any fixed value


class OutOfSlots(RuntimeError):
    """The pool cannot give a request the slots it asked for. Nothing was changed."""


def hash_block(parent: int, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: depends on the parent's hash and the block's token ids."""
    buf = np.empty(len(token_ids) + 1, dtype=np.uint64)
    buf[0] = parent
    buf[1:] = np.asarray(token_ids, dtype=np.int64).view(np.uint64)
    return _hash_bytes(buf.tobytes())


def block_hashes(token_ids: Sequence[int], block_size: int, start: int = 0,
                 parent: int = ROOT_HASH) -> list[int]:
    """Hashes of the full blocks of ``token_ids`` from block index ``start`` on (``parent`` is the
    hash of block start-1, or ROOT_HASH when start == 0). A trailing partial block has no hash."""
    out, h = [], parent
    for b in range(start, len(token_ids) // block_size):
        h = hash_block(h, token_ids[b * block_size:(b + 1) * block_size])
        out.append(h)
    return out


class StatePool:
    """Free list of slot indices 0..num_slots-1. Freed slots are reused first-in first-out."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfSlots(f"all {self.num_slots} state slots are in use")
        s = self._free.popleft()
        self._used.add(s)
        return s

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"slot {slot} is not allocated (double free?)")
        self._used.remove(slot)
        self._free.append(slot)

    def is_used(self, slot: int) -> bool:
        return slot in self._used


@dataclass(eq=False)
class CachedBlock:
    """One slot's worth of state. ``hash`` is None until committed (then it is cached)."""
    slot: int
    ref_count: int = 0
    hash: int | None = None


@dataclass
class _Req:
    tokens_total: int                      # tokens the request may ever compute
    blocks: list[CachedBlock] = field(default_factory=list)
    num_hit_blocks: int = 0                # leading blocks taken from the cache
    num_committed: int = 0                 # leading blocks registered (hit blocks count)
    last_hash: int = ROOT_HASH             # hash of block num_committed-1
    single_slot: int | None = None         # caching off: the one slot


@dataclass
class CacheStats:
    queried_tokens: int = 0   # prompt tokens looked up
    hit_tokens: int = 0       # of those, found in the cache (whole blocks)
    evictions: int = 0


class PrefixCache:
    """Block tables for requests, with a prefix cache over full blocks when ``enable_caching``.

    Typical use by an engine::

        hit = cache.allocate(rid, prompt, tokens_total)   # OutOfSlots -> request cannot start
        table = cache.block_table(rid)                     # slots, one per block
        ... after each step: cache.commit(rid, all_token_ids, num_computed)
        cache.free(rid)                                    # finished or aborted
    """

    def __init__(self, num_slots: int, block_size: int, enable_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = StatePool(num_slots)
        self._cached: dict[int, CachedBlock] = {}              # hash -> committed block
        self._evictable: OrderedDict[int, CachedBlock] = OrderedDict()  # ref 0 cached, LRU first
        self._reqs: dict[object, _Req] = {}
        self.stats = CacheStats()

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def num_available(self) -> int:
        """Slots a new request could get: free ones plus evictable cached ones."""
        return self.pool.num_free + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_needed(self, tokens_total: int) -> int:
        return max(1, -(-tokens_total // self.block_size))

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Cached tokens usable by a request with this prompt (whole blocks, at most len-1
        tokens so that one is left to compute). No side effects, counts nothing."""
        return len(self._match(token_ids)) * self.block_size

    def _match(self, token_ids: Sequence[int]) -> list[CachedBlock]:
        if not self.enable_caching or len(token_ids) == 0:
            return []
        # A prompt cached in full gives back its last block: there must be a token to compute
        # and the first computed token's state must sit at a block boundary.
        limit = (len(token_ids) - 1) // self.block_size
        out, h = [], ROOT_HASH
        for b in range(limit):
            h = hash_block(h, token_ids[b * self.block_size:(b + 1) * self.block_size])
            blk = self._cached.get(h)
            if blk is None:
                break
            out.append(blk)
        return out

    def block_table(self, rid) -> list[int]:
        return [b.slot for b in self._reqs[rid].blocks]

    def __contains__(self, rid) -> bool:
        return rid in self._reqs

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, rid, prompt: Sequence[int], tokens_total: int) -> int:
        """Give request ``rid`` a block table for ``tokens_total`` computed tokens (prompt plus
        generated tokens that will be fed back). Returns the number of prompt tokens found in the
        cache (a multiple of block_size; the request starts computing there).

        Raises OutOfSlots (nothing changed) if the pool cannot supply the fresh slots, ValueError
        for a duplicate id or a total shorter than the prompt."""
        if rid in self._reqs:
            raise ValueError(f"request {rid!r} already has blocks")
        if tokens_total < max(1, len(prompt)):
            raise ValueError(f"tokens_total={tokens_total} < prompt length {len(prompt)}")
        nblocks = self.blocks_needed(tokens_total)
        if not self.enable_caching:
            if self.pool.num_free < 1:
                raise OutOfSlots(f"request {rid!r} needs 1 state slot, 0 of {self.num_slots} free")
            s = self.pool.allocate()
            blk = CachedBlock(slot=s, ref_count=1)
            self._reqs[rid] = _Req(tokens_total, [blk] * nblocks, single_slot=s)
            self.stats.queried_tokens += len(prompt)
            return 0
        hits = self._match(prompt)
        need = nblocks - len(hits)
        # Hit blocks that are evictable now stop being evictable: they cannot pay for fresh ones.
        evictable_hits = sum(1 for b in hits if b.ref_count == 0)
        avail = self.pool.num_free + len(self._evictable) - evictable_hits
        if need > avail:
            raise OutOfSlots(
                f"request {rid!r} needs {need} fresh state slots ({nblocks} blocks, {len(hits)} "
                f"cached), only {avail} of {self.num_slots} can be freed")
        # From here on nothing can fail.
        for b in hits:
            if b.ref_count == 0:
                del self._evictable[b.hash]
            b.ref_count += 1
        fresh = [CachedBlock(slot=self._fresh_slot(), ref_count=1) for _ in range(need)]
        req = _Req(tokens_total, hits + fresh, num_hit_blocks=len(hits), num_committed=len(hits),
                   last_hash=hits[-1].hash if hits else ROOT_HASH)
        self._reqs[rid] = req
        self.stats.queried_tokens += len(prompt)
        self.stats.hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    def _fresh_slot(self) -> int:
        if self.pool.num_free == 0:
            _, victim = self._evictable.popitem(last=False)  # least recently used
            del self._cached[victim.hash]
            self.pool.free(victim.slot)
            self.stats.evictions += 1
        return self.pool.allocate()

    def commit(self, rid, token_ids: Sequence[int], num_computed: int) -> int:
        """Register the request's blocks whose end ``num_computed`` has passed (their slots now
        hold the state after the block and the request never writes them again). ``token_ids``
        must hold at least the first ``num_computed`` tokens. Returns how many were registered."""
        req = self._reqs[rid]
        if not self.enable_caching:
            return 0
        B = self.block_size
        full = min(num_computed, len(token_ids)) // B
        added = 0
        while req.num_committed < full:
            b = req.num_committed
            h = hash_block(req.last_hash, token_ids[b * B:(b + 1) * B])
            blk = req.blocks[b]
            if h not in self._cached:       # a twin computed concurrently keeps the first copy
                blk.hash = h
                self._cached[h] = blk
                added += 1
            req.last_hash = h
            req.num_committed += 1
        return added

    def free(self, rid) -> None:
        """Release a finished or aborted request. Uncached blocks return their slots at once;
        cached ones stay (evictable) once no request uses them. The tail blocks are queued for
        eviction before the head ones, since a prefix is more likely to be asked for again."""
        req = self._reqs.pop(rid)
        if req.single_slot is not None:
            self.pool.free(req.single_slot)
            return
        for blk in reversed(req.blocks):
            blk.ref_count -= 1
            if blk.ref_count > 0:
                continue
            if blk.hash is not None and self._cached.get(blk.hash) is blk:
                self._evictable[blk.hash] = blk
            else:
                self.pool.free(blk.slot)


    def reset(self) -> None:
        """Forget every cached block (requests must all be freed first)."""
        if self._reqs:
            raise RuntimeError(f"{len(self._reqs)} requests still hold blocks")
        for blk in self._evictable.values():
            self.pool.free(blk.slot)
        self._evictable.clear()
        self._cached.clear()

    # ---- debugging -----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""
        refs: dict[int, int] = {}
        slot_owner: dict[int, CachedBlock] = {}
        for req in self._reqs.values():
            seen = set()
            for blk in req.blocks:
                if id(blk) in seen:
                    continue
                seen.add(id(blk))
                refs[id(blk)] = refs.get(id(blk), 0) + 1
                prev = slot_owner.setdefault(blk.slot, blk)
                assert prev is blk, f"slot {blk.slot} held by two blocks"
        for blk in self._cached.values():
            prev = slot_owner.setdefault(blk.slot, blk)
            assert prev is blk, f"slot {blk.slot} held by two blocks"
            assert blk.ref_count == refs.get(id(blk), 0), "ref count mismatch"
            assert (blk.ref_count == 0) == (blk.hash in self._evictable), "evictable mismatch"
        for req in self._reqs.values():
            for blk in req.blocks:
                assert blk.ref_count == refs[id(blk)], "ref count mismatch"
        used = set(slot_owner)
        assert all(self.pool.is_used(s) for s in used), "a slot in use is on the free list"
        assert len(used) + self.pool.num_free == self.num_slots, "slots leaked"
