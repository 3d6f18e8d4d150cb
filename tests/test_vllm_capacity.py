"""KV-cache capacity with a GDN state at every block (issue 16), on vLLM 0.26's CPU build.

The tiny Qwen3-Next (3 GDN layers, 1 attention layer: one attention and three GDN KV-cache
groups, as in the full-size model) with CUDA's default attention block and TRITON_ATTN: blocks of
192 with the plugin, 144 in vLLM's own "align" mode. The specs are the GDN layer's own
(``get_kv_cache_spec``); the attention spec is built directly. Capacity and the start-up check
are vLLM's ``get_kv_cache_configs`` / ``get_kv_cache_capacity``.
"""

import pytest
import torch

from test_vllm_plugin import _engine_config, _final_block_size, vllm_cpu, vllm_dist  # noqa: F401

GIB = 1 << 30
ISSUE_MEMORY = int(41.3 * GIB)  # the H200 run of the issue


def gdn_spec(path, extra, max_model_len=32768, caching=True, **kw):
    """(engine config, the GDN layer's KV-cache spec) with the final block size."""
    import torch.nn as nn
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    from gdn_graphs.vllm.v0_26.model import switch_on_layers

    cfg = _engine_config(path, enable_prefix_caching=caching, block_size=16, additional_config=extra,
                         max_model_len=max_model_len, **kw)
    _final_block_size(cfg)
    with set_current_vllm_config(cfg):
        layer = QwenGatedDeltaNetAttention(cfg.model_config.hf_text_config, cfg,
                                           prefix=f"model.layers.{len(gdn_spec.made)}.linear_attn",
                                           gqa_interleaved_layout=True)
    gdn_spec.made.append(layer)
    switch_on_layers(nn.ModuleList([layer]), cfg)
    return cfg, layer.get_kv_cache_spec(cfg)


gdn_spec.made = []


def layer_specs(cfg, gdn):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    attn = FullAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=2, head_size=64,
                             dtype=torch.float32)
    specs = {f"model.layers.{i}.linear_attn": gdn for i in range(3)}
    specs["model.layers.3.self_attn.attn"] = attn
    return specs


def kv_config(cfg, gdn, memory):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    return get_kv_cache_configs(cfg, [layer_specs(cfg, gdn)], [memory])[0]


def capacity(cfg, gdn, memory):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    return get_kv_cache_capacity(cfg, kv_config(cfg, gdn, memory))


@pytest.fixture(scope="module")
def modes(vllm_dist):
    """{name: (engine config, GDN spec)}: the plugin, vLLM's "align", vLLM's "all" as it is."""
    from dataclasses import fields

    from vllm.v1.kv_cache_interface import MambaSpec

    from gdn_graphs.vllm.v0_26.state_pages import GDNStateSpec

    ours = gdn_spec(vllm_dist, {})
    align = gdn_spec(vllm_dist, {"gdn_graphs": False})
    assert type(ours[1]) is GDNStateSpec and ours[1].mamba_cache_mode == "all"
    assert type(align[1]) is MambaSpec and align[1].mamba_cache_mode == "align"
    plain = MambaSpec(**{f.name: getattr(ours[1], f.name) for f in fields(MambaSpec)})
    return {"ours": ours, "align": align, "vllm_all": (ours[0], plain)}


@pytest.mark.vllm
def test_capacity_within_5_percent_of_align(modes, capsys):
    got = {name: capacity(cfg, spec, ISSUE_MEMORY) for name, (cfg, spec) in modes.items()}
    with capsys.disabled():
        print("\ncapacity at 41.3 GiB, max_model_len 32768 (tokens, concurrency):",
              {k: (t, round(c, 2)) for k, (t, c) in got.items()})
    # vLLM's "all" as it is: 3.9x less than "align", as in the issue's H200 run (bf16 there, so
    # twice these float32 token counts: 84,171,049 and 21,603,597)
    assert 3.85 < got["align"][0] / got["vllm_all"][0] < 3.95
    tokens, conc = got["ours"]
    assert abs(tokens / got["align"][0] - 1) < 0.05 and abs(conc / got["align"][1] - 1) < 0.05


@pytest.mark.vllm
def test_table_width_still_covers_max_model_len(modes):
    cfg, spec = modes["ours"]
    assert spec.block_size == 192
    assert spec.max_num_blocks_per_req(cfg, 32768) == 171  # cdiv(32768, 192)
    assert spec.max_memory_usage_bytes(cfg) == spec.page_size_bytes


def _fits(cfg, spec, memory, max_model_len) -> bool:
    old = cfg.model_config.max_model_len
    cfg.model_config.max_model_len = max_model_len
    try:
        kv_config(cfg, spec, memory)
        return True
    except ValueError as e:
        assert "KV cache is needed" in str(e)
        return False
    finally:
        cfg.model_config.max_model_len = old


def _largest_fit(cfg, spec, memory, hi=32768) -> int:
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _fits(cfg, spec, memory, mid) else (lo, mid - 1)
    return lo


@pytest.mark.vllm
@pytest.mark.parametrize("memory", [20 << 20, 9 << 20, 3 << 20])
def test_largest_align_max_model_len_starts_with_the_plugin(modes, memory, capsys):
    """vLLM's start-up check (``_check_enough_kv_cache_memory`` in get_kv_cache_configs) at the
    largest max_model_len that "align" accepts: the plugin passes it, vLLM's "all" does not."""
    edge = _largest_fit(*modes["align"], memory)
    assert 1000 < edge < 32768 and not _fits(*modes["align"], memory, edge + 1)
    assert _fits(*modes["ours"], memory, edge)
    assert not _fits(*modes["vllm_all"], memory, edge)
    with capsys.disabled():
        print(f"\n{memory >> 20} MiB: largest max_model_len align {edge}, plugin "
              f"{_largest_fit(*modes['ours'], memory)}, vLLM all "
              f"{_largest_fit(*modes['vllm_all'], memory)}")


@pytest.mark.vllm
def test_plugin_off_or_no_prefix_caching_keeps_vllms_spec(vllm_dist):
    from vllm.v1.kv_cache_interface import MambaSpec

    for extra, caching in (({"gdn_graphs": False}, True), ({}, False)):
        cfg, spec = gdn_spec(vllm_dist, extra, caching=caching)
        assert type(spec) is MambaSpec and spec.mamba_cache_mode == ("align" if caching else "none")


@pytest.mark.vllm
@pytest.mark.parametrize("k", [2, 3])
def test_capacity_with_speculation_within_5_percent_of_align(vllm_dist, k, capsys):
    """With speculative decoding a request holds k + 2 private pages per GDN group (the
    lookahead layout's R = k + 1 columns and its current block; README "Conventions"), vLLM's
    "align" 2 + k: the capacity vLLM logs is within 5% of align's. With the k + 3 of the
    layout before (R = k + 2) it was 0.943x in bf16 Qwen3.5 MTP on an H200, outside."""
    from dataclasses import replace

    from gdn_graphs.vllm.v0_26.spec_pages import GDNSpecStateSpec

    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
            "prompt_lookup_min": 2}
    ours = gdn_spec(vllm_dist, {}, speculative_config=spec)
    align = gdn_spec(vllm_dist, {"gdn_graphs": False}, speculative_config=spec)
    assert type(ours[1]) is GDNSpecStateSpec and ours[1].num_speculative_blocks == k + 1
    assert align[1].num_speculative_blocks == k
    assert ours[1].max_memory_usage_bytes(ours[0]) == (k + 2) * ours[1].page_size_bytes
    assert (align[1].max_memory_usage_bytes(align[0])
            == (2 + k) * align[1].page_size_bytes)
    got = {name: capacity(cfg, s, ISSUE_MEMORY) for name, (cfg, s) in
           (("ours", ours), ("align", align),
            ("ours_k3", (ours[0], replace(ours[1], num_speculative_blocks=k + 2))))}
    with capsys.disabled():
        print(f"\nk={k}: capacity at 41.3 GiB (tokens, concurrency):",
              {n: (t, round(c, 2)) for n, (t, c) in got.items()})
    for i in (0, 1):
        assert abs(got["ours"][i] / got["align"][i] - 1) < 0.05
    assert got["ours_k3"][0] < got["ours"][0]
