"""GDNStateManager (the plugin's Mamba manager for mode "all") inside vLLM 0.26's own
KVCacheManager, hybrid coordinator and block pool, on vLLM's CPU build.

The KV-cache layout is the tiny Qwen3-Next's (one attention group and three GDN groups, blocks of
192, one page size). A small driver plays vLLM's scheduler: each step every running request gets
``allocate_slots`` for its next chunk (prefill) or token (decode), waiting requests are admitted
when their prefix hit and first chunk fit, a running request that cannot get its pages is
preempted (freed and re-queued) as vLLM does. After every call the pool is checked: each page's
refcount equals the number of requests holding it, no held page is in the free queue, no page is
in it twice, the manager's held-page count matches a recount, and the three GDN groups hold pages
at the same columns (a hit needs every group's state at one boundary).
"""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from test_vllm_plugin import vllm_cpu  # noqa: F401

B = 192
PAGE = B * 2 * 2 * 64 * 4  # the attention page (float32), which the GDN page is padded to


def specs(keep="all", step_tokens=2 * B, stats_every=0):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from gdn_graphs.vllm.v0_26.state_pages import GDNStateSpec, keep_every

    gdn = GDNStateSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=(torch.float32, torch.float32),
                       block_size=B, page_size_padded=PAGE, mamba_cache_mode="all",
                       step_tokens=step_tokens, keep_every=keep_every(keep),
                       stats_every=stats_every)
    attn = FullAttentionSpec(block_size=B, num_kv_heads=2, head_size=64, dtype=torch.float32)
    assert attn.page_size_bytes == gdn.page_size_bytes == PAGE
    return attn, gdn


def kv_manager(num_blocks, gdn=None, attn=None, max_model_len=32768):
    """vLLM's KVCacheManager over ``num_blocks`` pages (block 0 is vLLM's null block)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    init_none_hash(sha256)
    a, g = specs()
    attn, gdn = attn or a, gdn or g
    groups = [KVCacheGroupSpec(["model.layers.3.attn"], attn)] + [
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn"], gdn) for i in range(3)]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=B,
                          hash_block_size=B, max_in_flight_tokens=getattr(gdn, "step_tokens", 2 * B),
                          enable_caching=True, log_stats=True)


def request(rid, tokens, max_tokens=64):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), None,
                   block_hasher=get_request_block_hasher(B, sha256))


def gdn_managers(kvm):
    from gdn_graphs.vllm.v0_26.state_pages import GDNStateManager

    ms = [m for m in kvm.coordinator.single_type_managers if isinstance(m, GDNStateManager)]
    assert len(ms) == 3
    return ms


def check_pool(kvm):
    pool = kvm.block_pool
    holders = Counter(b.block_id for m in kvm.coordinator.single_type_managers
                      for blocks in m.req_to_blocks.values() for b in blocks if not b.is_null)
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert len(free) == len(set(free)) == pool.get_num_free_blocks(), "a page freed twice"
    assert not set(free) & set(holders), "a held page is in the free queue"
    assert all(pool.blocks[i].ref_cnt == 0 for i in free)
    for i, n in holders.items():
        assert pool.blocks[i].ref_cnt == n, f"page {i}: refcount {pool.blocks[i].ref_cnt}, {n} holders"
    ms = gdn_managers(kvm)
    assert ms[0].stats.held == sum(not b.is_null for m in ms for bl in m.req_to_blocks.values()
                                   for b in bl)
    assert len(free) + len(holders) == pool.num_gpu_blocks - 1  # every page but the null block
    for rid in ms[0].req_to_blocks:  # the GDN groups keep states at the same boundaries
        rows = [[not b.is_null for b in m.req_to_blocks[rid]] for m in ms]
        assert rows[0] == rows[1] == rows[2], rid


class Driver:
    """vLLM's scheduling loop reduced to what the KV-cache manager sees (synchronous steps)."""

    def __init__(self, kvm, chunk, check=True):
        self.kvm, self.chunk, self.check = kvm, chunk, check
        self.running, self.waiting, self.done = [], [], []
        self.hits, self.preempted = {}, 0

    def submit(self, req):
        self.waiting.append(req)

    def _check(self):
        if self.check:
            check_pool(self.kvm)

    def _last_pages_real(self, req):
        if not self.check:
            return
        for m in gdn_managers(self.kvm):
            blocks = m.req_to_blocks[req.request_id]
            assert not blocks[-1].is_null, "the page a step writes must be real"

    def step(self):
        kvm = self.kvm
        kvm.new_step_starts()
        for req in list(self.running):
            q = min(self.chunk, req.num_tokens - req.num_computed_tokens)
            if kvm.allocate_slots(req, q) is None:
                self.running.remove(req)  # preempted: freed, recomputed later
                kvm.free(req)
                req.num_computed_tokens = 0
                self.waiting.insert(0, req)
                self.preempted += 1
            else:
                self._last_pages_real(req)
                req.num_computed_tokens += q
            self._check()
        while self.waiting:
            req = self.waiting[0]
            blocks, hit, junction = kvm.get_computed_blocks(req)
            req.shared_prefix_boundary = junction  # as vLLM's scheduler does
            q = min(self.chunk, req.num_tokens - hit)
            if kvm.allocate_slots(req, q, hit, blocks) is None:
                break
            self.waiting.pop(0)
            self.hits.setdefault(req.request_id, hit)
            req.num_computed_tokens = hit + q
            self.running.append(req)
            self._last_pages_real(req)
            self._check()
        for req in list(self.running):  # the model's output: a token once the prompt is in
            if req.num_computed_tokens == req.num_tokens:
                if len(req.output_token_ids) >= req.sampling_params.max_tokens:
                    self.running.remove(req)
                    kvm.free(req)
                    self.done.append(req)
                    self._check()
                else:
                    req.append_output_token_ids(7)

    def run(self, max_steps=5000):
        for _ in range(max_steps):
            if not (self.running or self.waiting):
                return
            self.step()
        raise AssertionError("did not finish")


def cols(kvm, rid):
    """Per GDN group: the columns of the request's row that hold a page."""
    return [[j for j, b in enumerate(m.req_to_blocks[rid]) if not b.is_null]
            for m in gdn_managers(kvm)]


@pytest.mark.vllm
def test_registered_for_our_spec_only(vllm_cpu):
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from gdn_graphs.vllm.v0_26.state_pages import GDNStateManager

    _, gdn = specs()
    plain = MambaSpec(shapes=gdn.shapes, dtypes=gdn.dtypes, block_size=B, mamba_cache_mode="all")
    assert KVCacheSpecRegistry.get_manager_class(gdn) is GDNStateManager
    assert KVCacheSpecRegistry.get_manager_class(plain) is MambaManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(gdn) is MambaSpec


@pytest.mark.vllm
def test_a_prefill_with_room_stores_every_boundary_then_frees_them_to_the_cache(vllm_cpu):
    kvm = kv_manager(200)
    d = Driver(kvm, chunk=4096)
    P = 10 * B + 50
    d.submit(request("a", range(100, 100 + P), max_tokens=2))
    d.step()  # the whole prompt in one step: boundaries 1..10 blocks, write column 10
    assert cols(kvm, "a") == [list(range(11))] * 3
    d.step()  # a decode: the pages before the read column go back (cached, evictable), but for
    # the latest boundary passed (column 9), which the request keeps while it runs
    assert cols(kvm, "a") == [[9, 10]] * 3
    ms = gdn_managers(kvm)
    assert ms[0].stats.count_evictable() == 27 and ms[0].stats.ckpt_kept == 30
    d.run()
    # the same prompt again: every block but the last (vLLM caps hits at prompt - 1)
    blocks, hit, _ = kvm.get_computed_blocks(request("b", range(100, 100 + P)))
    assert hit == 10 * B


@pytest.mark.vllm
def test_hit_falls_back_block_by_block_when_the_longest_state_is_evicted(vllm_cpu):
    """vLLM's MambaManager.find_longest_cache_hit scans boundaries right to left and needs every
    GDN group's page at one boundary: an evicted page costs that one block, not the hit."""
    kvm = kv_manager(200)
    d = Driver(kvm, chunk=4096)
    P = 10 * B + 50
    d.submit(request("a", range(100, 100 + P), max_tokens=1))
    d.run()
    ms = gdn_managers(kvm)
    hashes = request("probe", range(100, 100 + P)).block_hashes

    def page(m, j):  # group m's cached page at column j (the state after j + 1 blocks)
        return kvm.block_pool.get_cached_block(hashes[j], [m.kv_cache_group_id])[0]

    def hit(rid):
        return kvm.get_computed_blocks(request(rid, range(100, 100 + P)))[1]

    assert hit("p0") == 10 * B
    kvm.block_pool.evict_blocks({page(ms[0], 9).block_id})
    assert hit("p1") == 9 * B
    kvm.block_pool.evict_blocks({page(ms[1], 8).block_id})
    assert hit("p2") == 8 * B
    kvm.block_pool.evict_blocks({page(ms[2], 3).block_id})  # an earlier hole changes nothing
    assert hit("p3") == 8 * B


@pytest.mark.vllm
def test_tight_pool_runs_in_place_where_vllms_all_mode_cannot(vllm_cpu):
    """Pages for one request's attention plus one per GDN group and a little more: ours runs it
    (the running state moves in place, checkpoints are skipped); vLLM's MambaManager, which wants
    a page per block passed, preempts it for ever."""
    from vllm.v1.kv_cache_interface import MambaSpec

    P, out = 9 * B + 20, 2 * B
    need = -(-(P + out) // B) + 3   # attention blocks + one page per GDN group
    kvm = kv_manager(need + 1 + 2)  # + the null block + 2
    d = Driver(kvm, chunk=2 * B)
    d.submit(request("a", range(5, 5 + P), max_tokens=out))
    d.run()
    stats = gdn_managers(kvm)[0].stats
    assert d.preempted == 0 and stats.in_place > 0 and stats.ckpt_skipped > 0
    assert stats.held == 0 and stats.peak_held <= 3 + 3 * 2

    _, gdn = specs()
    plain = MambaSpec(shapes=gdn.shapes, dtypes=gdn.dtypes, block_size=B,
                      page_size_padded=PAGE, mamba_cache_mode="all")
    d2 = Driver(kv_manager(need + 1 + 2, gdn=plain), chunk=2 * B, check=False)
    d2.submit(request("a", range(5, 5 + P), max_tokens=out))
    for _ in range(300):
        d2.step()
    assert not d2.done and d2.preempted > 0  # preempted at the same block, again and again


@pytest.mark.vllm
@pytest.mark.parametrize("pool", [40, 70, 120])
@pytest.mark.parametrize("seed", [0, 1])
def test_shared_system_prompt_under_pressure_keeps_refcounts_exact(vllm_cpu, seed, pool):
    """Requests sharing a system prompt, multi-turn follow-ups and unrelated prompts through a
    pool that holds a few of them: pages are shared, evicted, preempted and freed; every step's
    pool check holds, everything is free at the end, and later requests reuse the shared part."""
    rng = np.random.default_rng(seed)
    kvm = kv_manager(pool, gdn=replace(specs()[1], step_tokens=4 * B))
    d = Driver(kvm, chunk=3 * B)
    system = rng.integers(10, 4000, 6 * B + 30).tolist()
    reqs = []
    for i in range(12):
        if i % 3 == 2:  # a follow-up turn: an earlier request's prompt + its output + more
            prev = reqs[i - 2]
            toks = prev.prompt_token_ids + [7] * 8 + rng.integers(10, 4000, 150).tolist()
        elif i % 3 == 1:
            toks = rng.integers(10, 4000, int(rng.integers(300, 1500))).tolist()
        else:
            toks = system + rng.integers(10, 4000, int(rng.integers(100, 600))).tolist()
        reqs.append(request(f"r{i}", toks, max_tokens=int(rng.integers(5, 40))))
    for r in reqs:
        d.submit(r)
        d.step()
    d.run()
    ms = gdn_managers(kvm)
    assert len(d.done) == 12 and ms[0].stats.held == 0
    assert all(not m.req_to_blocks for m in kvm.coordinator.single_type_managers)
    shared = [d.hits[r.request_id] for i, r in enumerate(reqs) if i % 3 == 0][1:]
    assert max(shared) >= 6 * B  # the system prompt's state served a later request
    if pool == 40:  # room for about two requests: preemptions and in-place steps happened
        assert d.preempted > 0 and ms[0].stats.in_place > 0 and ms[0].stats.ckpt_skipped > 0


@pytest.mark.vllm
@pytest.mark.parametrize("keep,want", [("ends", [9, 10]), (4, [3, 7, 9, 10]), ("all", list(range(11)))])
def test_keep_states_knob(vllm_cpu, keep, want):
    """One 2,000-token prefill: the write page is column 10, the replay boundary (a returning
    prompt hits 1,999 tokens at most) the state after 10 blocks, column 9."""
    kvm = kv_manager(200, gdn=specs(keep=keep)[1])
    d = Driver(kvm, chunk=4096)
    d.submit(request("a", range(3, 3 + 10 * B + 80), max_tokens=2))
    d.step()
    assert cols(kvm, "a") == [want] * 3


@pytest.mark.vllm
def test_keep_states_values():
    from gdn_graphs.vllm.v0_26.state_pages import keep_every

    assert [keep_every(v) for v in (None, "all", "ends", 3)] == [1, 1, 0, 3]
    for bad in (0, -1, "some", True, 2.0):
        with pytest.raises(ValueError, match="keep_states"):
            keep_every(bad)


@pytest.mark.vllm
def test_stats_log_line_and_file(vllm_cpu, caplog, tmp_path, monkeypatch):
    import json

    from gdn_graphs.vllm.v0_26.state_pages import STATS_FILE_ENV

    path = tmp_path / "pages.json"
    monkeypatch.setenv(STATS_FILE_ENV, str(path))
    kvm = kv_manager(200, gdn=specs(stats_every=2)[1])
    d = Driver(kvm, chunk=4096)
    P = 5 * B + 10
    d.submit(request("a", range(3, 3 + P), max_tokens=3))
    with caplog.at_level("INFO", logger="vllm.gdn_graphs"):
        d.run()
        d.submit(request("b", range(3, 3 + P), max_tokens=3))
        d.run()
    assert "GDN pages held" in caplog.text
    snap = json.loads(path.read_text())
    assert snap["held"] == 0 and snap["peak_held"] == 3 * 6 and snap["hit_tokens"] == 5 * B
    assert snap["hit_requests"] == 1 and snap["admitted"] == 2 and snap["evictable"] > 0


@pytest.mark.vllm
def test_stats_by_time_while_requests_run(vllm_cpu, caplog):
    kvm = kv_manager(200, gdn=replace(specs()[1], stats_interval_s=1e-9))
    d = Driver(kvm, chunk=4096)
    d.submit(request("a", range(3, 3 + 2 * B), max_tokens=3))
    with caplog.at_level("INFO", logger="vllm.gdn_graphs"):
        d.run()
    assert caplog.text.count("GDN pages held") >= 2


@pytest.mark.vllm
def test_options_reach_the_spec(vllm_cpu):
    from types import SimpleNamespace as NS

    from vllm.v1.kv_cache_interface import MambaSpec

    from gdn_graphs.vllm.v0_26.state_pages import state_spec

    plain = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=(torch.float32,) * 2, block_size=B,
                      mamba_cache_mode="all")
    cfg = NS(max_in_flight_tokens=16384,
             additional_config={"gdn_graphs": {"keep_states": "ends", "stats_every": 50}})
    spec = state_spec(plain, cfg)
    assert (spec.step_tokens, spec.keep_every, spec.stats_every, spec.stats_interval_s) == \
        (16384, 0, 50, 10.0)
    assert spec.shapes == plain.shapes and spec.page_size_bytes == plain.page_size_bytes
    assert state_spec(plain, NS(max_in_flight_tokens=1, additional_config={})).keep_every == 1
    assert spec.junctions and not state_spec(plain, NS(max_in_flight_tokens=1, additional_config={},
                                                       kv_transfer_config=object())).junctions


@pytest.mark.vllm
def test_prefill_option_gates_the_flashinfer_workspace(vllm_cpu):
    """The FlashInfer prefill path is opt-in (``"prefill": "flashinfer"``): without it no layer's
    workspace carries a FiWorkspace, whatever the pool; an unknown value is refused."""
    from types import SimpleNamespace as NS

    from gdn_graphs.vllm.builder import GDNResources
    from gdn_graphs.vllm.v0_26.state_pages import prefill_option

    def opt(**o):
        return prefill_option(NS(additional_config={"gdn_graphs": o} if o else {}))

    assert opt() == "ours" and opt(prefill="flashinfer") == "flashinfer"
    with pytest.raises(ValueError, match="prefill must be one of"):
        opt(prefill="fi")
    args = (32, 128, 128, 16, torch.bfloat16, torch.device("cpu"))
    assert getattr(GDNResources(8, 256).workspace(*args, state_dtype=torch.float32), "fi",
                   None) is None
    # opted in, on a machine where FlashInfer's kernel cannot run: ours, with the reason logged
    assert GDNResources(8, 256, fi_prefill=True).workspace(*args, state_dtype=torch.float32).fi is None


@pytest.mark.vllm
def test_the_edge_pool_serves_a_near_max_prompt_and_a_system_prompt(vllm_cpu):
    """The capacity session's edge run on the CPU: a pool of max_model_len's attention blocks
    plus one page per GDN group and one more (what the plugin's start-up estimate lets through),
    prefill chunks of 8,192 tokens with two steps in flight: a prompt of max_model_len - 200
    runs without a preemption, and three questions on a 3,000-token system prompt reuse its
    whole blocks (2,880 tokens) from the second on."""
    L = 80 * B
    kvm = kv_manager(L // B + 3 + 2, gdn=replace(specs()[1], step_tokens=2 * 8192),
                     max_model_len=L)
    d = Driver(kvm, chunk=8192)
    rng = np.random.default_rng(3)
    system = rng.integers(10, 4000, 3000).tolist()
    for i in range(3):
        d.submit(request(f"q{i}", system + rng.integers(10, 4000, 200).tolist(), max_tokens=4))
        d.run()
    assert [d.hits[f"q{i}"] for i in range(3)] == [0, 2880, 2880]
    d.submit(request("long", rng.integers(10, 4000, L - 200).tolist(), max_tokens=8))
    d.run()
    assert d.preempted == 0 and gdn_managers(kvm)[0].stats.in_place > 0


@pytest.mark.vllm
def test_a_page_another_request_reads_is_never_moved_in_place(vllm_cpu):
    """A running request's state page that a second request also holds (a prefix hit on it) is
    not updated in place even when the pool has no slack: the step takes a fresh page, and the
    shared page keeps its column, its refcount and its cache entry."""
    kvm = kv_manager(60)
    d = Driver(kvm, chunk=4096)
    a = request("a", range(3, 3 + 2 * B - 1), max_tokens=B + 40)
    d.submit(a)
    d.step()
    d.step()  # prompt done, its first output token computed: 2 * B tokens, block 1 is full
    ms = gdn_managers(kvm)
    shared = [m.req_to_blocks["a"][1] for m in ms]
    kvm.block_pool.touch(shared)  # as a hit of another request on the state after 2 blocks
    hashes = [p.block_hash for p in shared]
    assert all(h is not None for h in hashes)
    free = kvm.block_pool.get_num_free_blocks()
    hold = kvm.block_pool.get_new_blocks(free - 6)  # no slack left, pages for the step remain
    in_place = ms[0].stats.in_place
    d.check = False
    d.step()  # crosses into block 2
    assert ms[0].stats.in_place == in_place
    for m, p, h in zip(ms, shared, hashes):
        row = m.req_to_blocks["a"]
        assert row[1] is p and p.ref_cnt == 2 and p.block_hash == h and row[2] is not p
    # and without the other holder the same squeeze moves the page in place
    kvm.block_pool.free_blocks(shared)
    for _ in range(B):
        d.step()
    assert ms[0].stats.in_place > in_place
    kvm.block_pool.free_blocks(hold)


@pytest.mark.vllm
def test_shared_prefix_junction_gets_a_page_and_is_kept_while_its_request_runs(vllm_cpu):
    """keep_states "ends": the first request stores no state at the end of the system prompt.
    The second finds the prompt in the attention groups only; vLLM reports the junction
    (shared_prefix_boundary) and the manager gives that boundary a page in every GDN group and
    keeps it while the request runs: the third request reuses the system prompt."""
    kvm = kv_manager(300, gdn=specs(keep="ends")[1])
    d = Driver(kvm, chunk=4096)
    rng = np.random.default_rng(5)
    system = rng.integers(10, 4000, 6 * B + 30).tolist()
    ask = [request(f"q{i}", system + rng.integers(10, 4000, 300).tolist(), max_tokens=30)
           for i in range(3)]
    d.submit(ask[0])
    d.run()
    d.submit(ask[1])
    d.step()
    assert d.hits["q1"] == 0 and ask[1].shared_prefix_boundary == 6 * B
    for _ in range(5):
        d.step()  # decoding: the junction page (column 5) stays
    ms = gdn_managers(kvm)
    assert all(not m.req_to_blocks["q1"][5].is_null for m in ms)
    assert ms[0].stats.junction_pages == 1
    d.submit(ask[2])
    d.run()
    assert d.hits["q2"] == 6 * B
