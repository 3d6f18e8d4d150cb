"""Prefix cache and slot pool: hashing, reference counts, LRU eviction, exhaustion, no leaks."""

import random

import pytest

from gdn_graphs.engine import prefix_cache
from gdn_graphs.engine.prefix_cache import (ROOT_HASH, OutOfSlots, PrefixCache, StatePool,
                                            UnknownRequest, block_hashes, hash_block)

B = 64


def toks(n, seed=0, vocab=1000):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def run_request(cache, rid, prompt, total=None, finish=True):
    """Admit, 'compute' everything, commit, optionally free. Returns (hit tokens, table)."""
    total = total or len(prompt)
    hit = cache.allocate(rid, prompt, total)
    table = cache.block_table(rid)
    cache.commit(rid, prompt, len(prompt))
    if finish:
        cache.free(rid)
    cache.check_invariants()
    return hit, table


def test_hash_chaining():
    blk = toks(B, 1)
    a, b = toks(B, 2), toks(B, 3)
    ha = block_hashes(a + blk, B)
    hb = block_hashes(b + blk, B)
    assert ha[0] != hb[0]
    assert ha[1] != hb[1], "equal block after different prefixes must hash differently"
    assert hash_block(ROOT_HASH, blk) != ha[1]
    assert block_hashes(a + blk, B) == ha, "deterministic"
    assert block_hashes(a + blk + [1, 2, 3], B) == ha, "a partial block has no hash"
    assert block_hashes(a + blk, B, start=1, parent=ha[0]) == ha[1:]


def test_state_pool():
    p = StatePool(3)
    s = [p.allocate() for _ in range(3)]
    assert sorted(s) == [0, 1, 2] and p.num_free == 0
    with pytest.raises(OutOfSlots):
        p.allocate()
    p.free(s[1])
    with pytest.raises(ValueError):
        p.free(s[1])
    assert p.allocate() == s[1]


def test_hit_is_whole_blocks_and_refcounts():
    c = PrefixCache(16, B)
    prompt = toks(3 * B + 10)
    hit, t1 = run_request(c, "a", prompt, finish=False)
    assert hit == 0 and len(t1) == 4 and len(set(t1)) == 4
    assert c.num_cached_blocks == 3                      # the partial block is not cached
    # a second request with the same first 2 blocks and a different third one
    p2 = prompt[:2 * B] + toks(B + 5, 9)
    hit2 = c.allocate("b", p2, len(p2) + 20)
    t2 = c.block_table("b")
    assert hit2 == 2 * B
    assert t2[:2] == t1[:2] and not set(t2[2:]) & set(t1), "new blocks get fresh slots"
    c.check_invariants()
    c.free("a")
    c.check_invariants()
    # blocks 0,1 still used by b: not evictable; block 2 of a is evictable
    assert c.num_available == 16 - len(t2)
    c.free("b")
    c.check_invariants()
    assert c.num_available == 16
    assert c.stats.queried_tokens == len(prompt) + len(p2) and c.stats.hit_tokens == 2 * B


def test_full_prompt_hit_gives_back_last_block():
    c = PrefixCache(16, B)
    prompt = toks(3 * B)
    run_request(c, "a", prompt)
    hit, table = run_request(c, "b", prompt, finish=False)
    assert hit == 2 * B, "there must be a token to compute"
    assert c.lookup(prompt) == 2 * B and c.lookup(prompt + [5]) == 3 * B
    # b recomputes block 2 into a fresh slot; the cached twin keeps its slot
    c.commit("b", prompt, len(prompt))
    c.free("b")
    c.check_invariants()
    assert c.num_cached_blocks == 3


def test_lru_eviction_order():
    c = PrefixCache(4, B)
    pa, pb = toks(2 * B + 1, 1), toks(2 * B + 1, 2)
    _, ta = run_request(c, "a", pa)                   # caches a0 a1, 3 slots while running
    _, tb = run_request(c, "b", pb)                   # needs 3: 1 free + evict
    # a was freed tail first, so a1 was queued before a0: a1 is the LRU victim
    assert c.lookup(pa) == B, "a's tail block was evicted first, its head survived"
    assert c.stats.evictions >= 1
    # touching a0 (hit) makes it most recent: the next eviction takes b's blocks first
    c.allocate("a2", pa[:B + 1], B + 1)
    c.free("a2")
    c.allocate("d", toks(2 * B + 1, 4), 2 * B + 1)   # needs 3 fresh slots
    c.check_invariants()
    c.free("d")
    c.check_invariants()
    assert c.lookup(pa) == B and c.lookup(pb) == 0


def test_exhaustion_raises_without_side_effects():
    c = PrefixCache(5, B)
    pa = toks(2 * B + 3, 1)
    c.allocate("a", pa, 3 * B)  # 3 blocks
    c.commit("a", pa, 2 * B)
    before = (c.block_table("a"), c.pool.num_free, c.num_cached_blocks, c.stats.queried_tokens)
    with pytest.raises(OutOfSlots, match="'b'"):
        c.allocate("b", toks(3 * B, 2), 3 * B)       # needs 3, only 2 free
    assert "b" not in c
    assert (c.block_table("a"), c.pool.num_free, c.num_cached_blocks,
            c.stats.queried_tokens) == before
    c.check_invariants()
    # once a is gone its cached blocks are evictable and pay for fresh ones (tail first)
    c.free("a")
    c.allocate("x", toks(4 * B, 7), 4 * B)           # 4 blocks: 3 free slots + 1 eviction
    assert c.stats.evictions == 1 and c.lookup(pa) == B
    c.check_invariants()


def test_hits_cannot_pay_for_fresh_blocks():
    c = PrefixCache(4, B)
    p = toks(2 * B + 1, 1)
    run_request(c, "a", p)                           # a0, a1 cached and evictable, 2 slots free
    # b hits a0 and a1 and needs 3 fresh blocks: 4 - 2 hit = 2 slots left -> refused
    with pytest.raises(OutOfSlots):
        c.allocate("b", p[:2 * B] + toks(3 * B, 2), 5 * B)
    assert c.lookup(p) == 2 * B, "refusal evicted nothing"
    c.check_invariants()


def test_abort_frees_everything():
    c = PrefixCache(8, B)
    p = toks(4 * B + 7)
    c.allocate("a", p, 6 * B)
    c.commit("a", p, 2 * B)                          # aborted mid-prefill
    c.free("a")
    c.check_invariants()
    assert c.num_available == 8 and c.num_cached_blocks == 2
    c.reset()
    assert c.pool.num_free == 8 and c.num_cached_blocks == 0


def test_caching_off_one_slot_per_request():
    c = PrefixCache(2, B, enable_caching=False)
    p = toks(3 * B)
    assert c.allocate("a", p, 5 * B) == 0
    t = c.block_table("a")
    assert len(t) == 5 and len(set(t)) == 1
    c.commit("a", p, 3 * B)
    assert c.num_cached_blocks == 0
    c.allocate("b", p, 5 * B)
    with pytest.raises(OutOfSlots):
        c.allocate("c", p, 3 * B)
    c.free("a"), c.free("b")
    c.check_invariants()
    assert c.pool.num_free == 2


def test_twins_computed_concurrently():
    c = PrefixCache(16, B)
    p = toks(2 * B + 1)
    c.allocate("a", p, len(p))
    c.allocate("b", p, len(p))                       # nothing cached yet: both compute
    c.commit("a", p, len(p))
    c.commit("b", p, len(p))                         # b's copies stay private
    c.check_invariants()
    c.free("b"), c.free("a")
    c.check_invariants()
    assert c.num_cached_blocks == 2 and c.num_available == 16


# hash functions for the collision tests: every block collides, or half of them do
COLLIDING = {"real": None, "constant": lambda parent, tokens: 7,
             "two values": lambda parent, tokens: int(tokens[0]) % 2}


@pytest.fixture(params=list(COLLIDING))
def hash_fn(request, monkeypatch):
    if COLLIDING[request.param] is not None:
        monkeypatch.setattr(prefix_cache, "hash_block", COLLIDING[request.param])
    return request.param


def test_collision_is_a_miss(monkeypatch):
    monkeypatch.setattr(prefix_cache, "hash_block", COLLIDING["constant"])
    c = PrefixCache(16, B)
    pa = toks(2 * B + 10, 1)
    _, ta = run_request(c, "a", pa, finish=False)
    assert c.num_cached_blocks == 1, "every block of a hashes alike: only its first is cached"
    pb = toks(2 * B + 10, 2)                          # other tokens, same (constant) hashes
    assert c.lookup(pb) == 0
    hit, tb = run_request(c, "b", pb, finish=False)
    assert hit == 0 and not set(tb) & set(ta), "b got one of a's slots"
    assert c.stats.hit_tokens == 0
    c.free("a"), c.free("b")
    c.check_invariants()


def test_collision_of_equal_blocks_at_two_positions(monkeypatch):
    # block 1 has block 0's tokens and (forced) its hash: only the parent tells them apart
    monkeypatch.setattr(prefix_cache, "hash_block", COLLIDING["constant"])
    c = PrefixCache(16, B)
    x = toks(B, 3)
    hit, t = run_request(c, "x", x + x + [1])
    assert c.lookup(x + x + [5]) == B, "the state after x is not the state after x + x"
    hit, t2 = run_request(c, "y", x + x + [5])
    assert hit == B and t2[0] == t[0]


def test_collision_with_an_unused_block_replaces_it(monkeypatch):
    monkeypatch.setattr(prefix_cache, "hash_block", COLLIDING["constant"])
    c = PrefixCache(8, B)
    pa, pb = toks(B + 1, 1), toks(B + 1, 2)
    run_request(c, "a", pa)                           # a0 cached, unused
    hit, tb = run_request(c, "b", pb)                 # b0 collides with a0: the newer one stays
    assert hit == 0 and c.stats.evictions == 1
    assert c.lookup(pa) == 0 and c.lookup(pb) == B
    hit, tb2 = run_request(c, "b2", pb)
    assert hit == B and tb2[0] == tb[0], "b's own state, not a's"


def test_random_lifecycles_do_not_leak(hash_fn):
    """Random admissions, progress and frees. Every hit block's slot holds the state of the
    prompt's own prefix (checked against what each slot was last computed for), whatever the
    hash function: real, constant or two-valued."""
    rng = random.Random(0)
    c = PrefixCache(24, B)
    prefixes = [toks(rng.randrange(1, 4) * B, s) for s in range(4)]
    live, content = {}, {}                          # content: slot -> the tokens its state is of
    for it in range(600):
        op = rng.random()
        if op < 0.5 or not live:
            pre = rng.choice(prefixes)
            prompt = pre[: rng.randrange(0, len(pre) + 1)] + toks(rng.randrange(1, 2 * B), 1000 + it)
            total = len(prompt) + rng.randrange(0, 2 * B)
            avail = c.num_available
            try:
                hit = c.allocate(it, prompt, total)
            except OutOfSlots:
                assert it not in c and c.num_available == avail
                continue
            assert hit % B == 0 and hit < len(prompt)
            table = c.block_table(it)
            assert len(table) == -(-total // B)
            for b in range(hit // B):
                assert content[table[b]] == tuple(prompt[:(b + 1) * B]), "another prompt's state"
            live[it] = [prompt, hit, total]
        else:
            rid = rng.choice(list(live))
            prompt, n, total = live[rid]
            if rng.random() < 0.6 and n < total:        # progress
                n2 = min(total, n + rng.randrange(1, 3 * B))
                tokens = prompt + toks(max(0, n2 - len(prompt)), rid)
                table = c.block_table(rid)
                for b in range(n // B, n2 // B):         # the blocks this step completed
                    content[table[b]] = tuple(tokens[:(b + 1) * B])
                c.commit(rid, tokens, n2)
                live[rid][1] = n2
            else:                                       # finish or abort
                c.free(rid)
                del live[rid]
        c.check_invariants()
    for rid in list(live):
        c.free(rid)
    c.check_invariants()
    assert c.num_available == 24
    # the cache never hands one slot to two live requests' written blocks (checked above);
    # and after everything is freed, every slot is free or cached-evictable
    assert c.pool.num_free + c.num_cached_blocks == 24
    assert c.stats.hit_tokens > 0, "the prompts share prefixes: some must hit"


def test_misuse_names_the_request_and_changes_nothing():
    c = PrefixCache(8, B)
    p = toks(2 * B + 5)
    c.allocate("a", p, 3 * B)
    c.commit("a", p, B)
    for call in (lambda: c.free("nope"), lambda: c.block_table("nope"),
                 lambda: c.commit("nope", p, B)):
        with pytest.raises(UnknownRequest, match="'nope'"):
            call()
    with pytest.raises(ValueError, match=r"'a'.*tokens_total=192"):
        c.commit("a", p + toks(2 * B), 4 * B)         # past the request's tokens
    with pytest.raises(ValueError, match=r"'a'.*len\(token_ids\)=133"):
        c.commit("a", p, 2 * B + 6)                   # past the tokens given
    with pytest.raises(ValueError, match="'a'"):
        c.commit("a", p, -1)
    assert c.num_cached_blocks == 1
    c.check_invariants()
    c.free("a")
    with pytest.raises(KeyError, match="'a'.*already freed") as e:  # UnknownRequest is a KeyError
        c.free("a")
    assert str(e.value).startswith("request 'a'"), "the message, not its repr"
    c.check_invariants()
    assert c.num_available == 8
