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
  any later request with the same tokens.

A 64-bit hash collides (by chance, or on purpose: token ids are user input), so the hash only
finds a candidate. A cached block keeps its token ids and its parent (the cached block before it)
and a lookup takes it only if both are the ones the prompt has, so every hit holds exactly the
state of the prompt's own prefix; a collision is a miss. That costs B ints per cached block.

Lifetime of a slot with caching on: fresh (owned by one request, uncached) -> committed (cached,
ref count = requests using it) -> ref count 0: kept, evictable, in LRU order -> evicted when a
request needs a fresh slot and the free list is empty (its hash is forgotten, its slot reused).
A request that hits a cached block only reads its slot (reads the state after its last hit block);
every block it computes gets a fresh slot, so shared states are never overwritten.

With caching off a request owns exactly one slot and its block table is that slot repeated (the
planner drops checkpoints equal to the write slot, so the kernels keep only the running state).

Errors: running out of slots raises ``OutOfSlots`` for the request that asked, *before* anything is
changed (counts are checked first, then mutations happen), so other requests are never affected.
Misuse (an unknown or already freed request id, a commit past the request's tokens) raises
``UnknownRequest`` (a KeyError) or ValueError naming the request, and changes nothing.
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


class UnknownRequest(KeyError):
    """The cache holds no blocks for this request id (never allocated, or already freed)."""

    def __str__(self) -> str:  # KeyError would print the message quoted, as a repr
        return str(self.args[0]) if self.args else ""


def hash_block(parent: int, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: depends on the parent's hash and the block's token ids."""
    buf = np.empty(len(token_ids) + 1, dtype=np.uint64)
    buf[0] = parent
    buf[1:] = np.asarray(token_ids, dtype=np.int64).view(np.uint64)
    return _hash_bytes(buf.tobytes())


def _holds(blk: CachedBlock, parent: CachedBlock | None, tokens: tuple[int, ...]) -> bool:
    """Whether cached ``blk`` holds the state after ``tokens`` following ``parent``'s state (the
    hash only says it may: see the module docstring)."""
    return blk.parent is parent and blk.tokens == tokens


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
    """One slot's worth of state. ``hash`` is None until committed (then it is cached); a cached
    block also keeps what its state is the state of: its token ids and the cached block before it
    (None for block 0), compared on every hit since the hash alone can collide."""
    slot: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] | None = None
    parent: CachedBlock | None = None


@dataclass
class _Req:
    tokens_total: int                      # tokens the request may ever compute
    blocks: list[CachedBlock] = field(default_factory=list)
    num_hit_blocks: int = 0                # leading blocks taken from the cache
    num_committed: int = 0                 # leading blocks registered (hit blocks count)
    last_hash: int = ROOT_HASH             # hash of block num_committed-1
    # the cached block holding the state of blocks [0, num_committed) (None: no block yet), or
    # _UNREACHABLE once a block collided with a different cached one: a lookup stops at that
    # block, so the request's later blocks could never be hit and are not registered
    parent: object = None
    single_slot: int | None = None         # caching off: the one slot


_UNREACHABLE = object()


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
        out, h, parent = [], ROOT_HASH, None
        for b in range(limit):
            tokens = tuple(token_ids[b * self.block_size:(b + 1) * self.block_size])
            h = hash_block(h, tokens)
            blk = self._cached.get(h)
            if blk is None or not _holds(blk, parent, tokens):
                break
            out.append(blk)
            parent = blk
        return out

    def _req(self, rid) -> _Req:
        try:
            return self._reqs[rid]
        except KeyError:
            raise UnknownRequest(f"request {rid!r} holds no blocks (never allocated, or already "
                                 f"freed)") from None

    def block_table(self, rid) -> list[int]:
        return [b.slot for b in self._req(rid).blocks]

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
                   last_hash=hits[-1].hash if hits else ROOT_HASH,
                   parent=hits[-1] if hits else None)
        self._reqs[rid] = req
        self.stats.queried_tokens += len(prompt)
        self.stats.hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    def _fresh_slot(self) -> int:
        if self.pool.num_free == 0:
            _, victim = self._evictable.popitem(last=False)  # least recently used
            self._evict(victim)
        return self.pool.allocate()

    def _evict(self, blk: CachedBlock) -> None:
        """Forget an unused cached block and free its slot (the caller took it off _evictable)."""
        del self._cached[blk.hash]
        # a child still cached names it as parent (by identity, which stays valid); the tokens
        # are never read again, and dropping the parent keeps no evicted chain alive
        blk.tokens = blk.parent = None
        self.pool.free(blk.slot)
        self.stats.evictions += 1

    def commit(self, rid, token_ids: Sequence[int], num_computed: int) -> int:
        """Register the request's blocks whose end ``num_computed`` has passed (their slots now
        hold the state after the block and the request never writes them again). ``token_ids``
        must hold at least the first ``num_computed`` tokens. Returns how many were registered.

        Raises UnknownRequest for an id without blocks, ValueError (nothing changed) for a
        ``num_computed`` below 0, above ``len(token_ids)`` or above the request's tokens_total."""
        req = self._req(rid)
        if not 0 <= num_computed <= min(len(token_ids), req.tokens_total):
            raise ValueError(
                f"commit of request {rid!r}: num_computed={num_computed} must be in [0, "
                f"min(len(token_ids)={len(token_ids)}, tokens_total={req.tokens_total})]")
        if not self.enable_caching:
            return 0
        B = self.block_size
        added = 0
        while req.num_committed < num_computed // B:
            b = req.num_committed
            tokens = tuple(token_ids[b * B:(b + 1) * B])
            h = hash_block(req.last_hash, tokens)
            added += self._register(req, req.blocks[b], h, tokens)
            req.last_hash = h
            req.num_committed += 1
        return added

    def _register(self, req: _Req, blk: CachedBlock, h: int, tokens: tuple[int, ...]) -> int:
        """Cache ``blk`` (the request's next block) under ``h`` unless a block with the same
        content is cached already; advance req.parent. Returns 1 if blk was registered."""
        if req.parent is _UNREACHABLE:
            return 0
        other = self._cached.get(h)
        if other is not None and _holds(other, req.parent, tokens):
            req.parent = other          # a twin computed concurrently: the first copy stays
            return 0
        if other is not None and other.ref_count > 0:
            req.parent = _UNREACHABLE   # a collision with a block in use: ours stays private
            return 0
        if other is not None:           # a collision with an unused block: the newer one wins
            del self._evictable[h]
            self._evict(other)
        blk.hash, blk.tokens, blk.parent = h, tokens, req.parent
        self._cached[h] = blk
        req.parent = blk
        return 1

    def free(self, rid) -> None:
        """Release a finished or aborted request. Uncached blocks return their slots at once;
        cached ones stay (evictable) once no request uses them. The tail blocks are queued for
        eviction before the head ones, since a prefix is more likely to be asked for again.
        Raises UnknownRequest for an id without blocks (never allocated, or freed already)."""
        req = self._req(rid)
        del self._reqs[rid]
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
        for h, blk in self._cached.items():
            prev = slot_owner.setdefault(blk.slot, blk)
            assert prev is blk, f"slot {blk.slot} held by two blocks"
            assert blk.hash == h and len(blk.tokens) == self.block_size, "cached block's key"
            assert blk.ref_count == refs.get(id(blk), 0), "ref count mismatch"
            assert (blk.ref_count == 0) == (blk.hash in self._evictable), "evictable mismatch"
        for req in self._reqs.values():
            for blk in req.blocks:
                assert blk.ref_count == refs[id(blk)], "ref count mismatch"
        used = set(slot_owner)
        assert all(self.pool.is_used(s) for s in used), "a slot in use is on the free list"
        assert len(used) + self.pool.num_free == self.num_slots, "slots leaked"
