"""Speculative decoding with the plugin: which configurations it accepts (and what it sets),
the one error for each it refuses, the MTP draft model built in an engine in mode "all", and
``tools/tiny_model.py --mtp`` / ``--eagle3-for`` loading through vLLM's own Qwen3NextMTP and
Eagle3LlamaForCausalLM weight names."""

import dataclasses
from types import SimpleNamespace as NS

import pytest
import torch

from test_vllm_plugin import _engine_config, vllm_cpu  # noqa: F401

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    from tools.tiny_model import make_tiny_qwen3_next

    return str(make_tiny_qwen3_next(tmp_path_factory.mktemp("mtp") / "qwen3_next_mtp",
                                    dtype="float32", mtp=True))


@pytest.fixture(scope="module")
def tiny_eagle3(vllm_cpu, tmp_path_factory):
    from tools.tiny_model import make_tiny_eagle3_head

    return str(make_tiny_eagle3_head(tmp_path_factory.mktemp("eagle3") / "head", vllm_cpu))


def _eagle3(head, k=3):
    """The speculative_config profiling/vllm_e2e.py passes for ``--spec eagle3`` (the GPU runs')."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "profiling" / "vllm_e2e.py"
    spec = importlib.util.spec_from_file_location("vllm_e2e", path)
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    with pytest.raises(SystemExit, match="--spec-model"):
        e2e.speculative_config("eagle3", k)
    return e2e.speculative_config("eagle3", k, head)


@pytest.mark.vllm
def test_ngram_is_accepted_in_mode_all_with_lookahead_pages(vllm_cpu):
    from vllm.v1.attention.backend import AttentionCGSupport

    from gdn_graphs.vllm.v0_26.model import GDNGraphsBuilder

    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, speculative_config=NGRAM)
    assert cfg.cache_config.mamba_cache_mode == "all"
    assert cfg.scheduler_config.async_scheduling is False  # vLLM's default would stay off too
    assert cfg.speculative_config.num_speculative_tokens == 3
    # FULL decode graphs of 1 + k tokens a row need UNIFORM_BATCH; without speculation the
    # single-token level stays
    assert GDNGraphsBuilder.get_cudagraph_support(cfg, None) == AttentionCGSupport.UNIFORM_BATCH
    plain = _engine_config(vllm_cpu, enable_prefix_caching=True)
    assert (GDNGraphsBuilder.get_cudagraph_support(plain, None)
            == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    # vLLM's model runner passes num_decode_draft_tokens_cpu to the builders it takes for GDN
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder
    assert issubclass(GDNGraphsBuilder, GDNAttentionMetadataBuilder)
    assert GDNAttentionMetadataBuilder not in GDNGraphsBuilder.__mro__  # nothing inherited


@pytest.mark.vllm
def test_mtp_is_accepted(vllm_cpu, tiny_mtp):
    cfg = _engine_config(tiny_mtp, enable_prefix_caching=True, max_model_len=4096,
                         speculative_config={"method": "qwen3_next_mtp",
                                             "num_speculative_tokens": 2})
    sc = cfg.speculative_config
    assert (sc.method, sc.num_speculative_tokens) == ("mtp", 2)
    assert sc.draft_model_config.hf_config.architectures == ["Qwen3NextMTP"]
    assert cfg.cache_config.mamba_cache_mode == "all"
    # vLLM turns async scheduling on for MTP by default where its executor supports it (on a
    # GPU; this CPU build keeps it off); the plugin leaves that choice to vLLM (next test)
    off = _engine_config(tiny_mtp, enable_prefix_caching=True, max_model_len=4096,
                         speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                         additional_config={"gdn_graphs": False})
    assert cfg.scheduler_config.async_scheduling is off.scheduler_config.async_scheduling


@pytest.mark.vllm
def test_eagle3_is_accepted(vllm_cpu, tiny_eagle3):
    """An EAGLE-3 head on the target's auxiliary hidden states: mode "all", the lookahead pages'
    k, vLLM's EAGLE handling (use_eagle: the last matched block dropped, as with MTP), and the
    same async choice with the plugin on as off."""
    kw = dict(enable_prefix_caching=True, max_model_len=4096, speculative_config=_eagle3(tiny_eagle3))
    cfg = _engine_config(vllm_cpu, **kw)
    sc = cfg.speculative_config
    assert (sc.method, sc.num_speculative_tokens) == ("eagle3", 3)
    assert sc.use_eagle()
    assert sc.draft_model_config.hf_config.architectures == ["LlamaForCausalLMEagle3"]
    # three distinct target layers feed fc [H, 3 H] (vLLM's default for 4 layers names two)
    ids = sc.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids
    n_layers = cfg.model_config.hf_config.num_hidden_layers
    assert len(set(ids)) == 3 and all(0 <= i < n_layers for i in ids), (ids, n_layers)
    assert cfg.cache_config.mamba_cache_mode == "all"
    off = _engine_config(vllm_cpu, **kw, additional_config={"gdn_graphs": False})
    assert off.cache_config.mamba_cache_mode == "align"
    assert cfg.scheduler_config.async_scheduling is off.scheduler_config.async_scheduling


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "mtp"])
@pytest.mark.parametrize("async_scheduling", [None, True, False])
def test_async_scheduling_is_what_vllm_sets_without_the_plugin(vllm_cpu, tiny_mtp, method,
                                                               async_scheduling):
    """The plugin changes no async setting: set or unset, an engine gets the same
    async_scheduling (or the same vLLM error) with the plugin on as off."""
    spec = {"ngram": NGRAM, "ngram_gpu": {"method": "ngram_gpu", "num_speculative_tokens": 3},
            "mtp": {"method": "mtp", "num_speculative_tokens": 2}}[method]
    path = tiny_mtp if method == "mtp" else vllm_cpu
    kw = dict(enable_prefix_caching=True, max_model_len=4096, speculative_config=spec)
    if async_scheduling is not None:
        kw["async_scheduling"] = async_scheduling

    def outcome(**extra):
        try:
            return _engine_config(path, **kw, **extra).scheduler_config.async_scheduling
        except Exception as e:  # vLLM's own refusal (ngram with async_scheduling=True)
            return f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"

    on = outcome()
    assert on == outcome(additional_config={"gdn_graphs": False}), (method, async_scheduling)
    if async_scheduling is False or (async_scheduling is None and method == "ngram"):
        assert on is False  # vLLM's choice for the CPU n-gram drafter
    print(method, async_scheduling, "->", on)


@pytest.mark.vllm
@pytest.mark.parametrize("spec, extra, message", [
    (NGRAM, {"enable_prefix_caching": False}, "Turn prefix caching on"),
    (dict(NGRAM, num_speculative_tokens=64), {}, "num_speculative_tokens in [1, 63]"),
])
def test_unsupported_speculation_is_refused_with_what_to_change(vllm_cpu, spec, extra, message):
    kw = {"enable_prefix_caching": True, **extra}
    with pytest.raises(Exception) as err:
        _engine_config(vllm_cpu, speculative_config=spec, **kw)
    text = str(err.value)
    assert message in text, text
    assert "additional_config={'gdn_graphs': False}" in text


@pytest.mark.vllm
def test_refusal_messages_name_the_fix(vllm_cpu):
    """check_speculative on its own (no engine config): each refusal says what to change."""
    from gdn_graphs.vllm.v0_26.config import check_speculative

    def cfg(**spec):
        sc = NS(method="ngram", num_speculative_tokens=3, parallel_drafting=False)
        for k, v in spec.items():
            setattr(sc, k, v)
        return NS(speculative_config=sc, cache_config=NS(enable_prefix_caching=True),
                  scheduler_config=NS(async_scheduling=None))

    for async_scheduling in (None, True, False):
        ok = cfg()  # left as it is: unset, vLLM decides later
        ok.scheduler_config.async_scheduling = async_scheduling
        check_speculative(ok)
        assert ok.scheduler_config.async_scheduling is async_scheduling
    for method in ("ngram_gpu", "eagle3", "mtp", "qwen3_next_mtp", "qwen3_5_mtp"):
        check_speculative(cfg(method=method))
    with pytest.raises(ValueError, match="parallel_drafting"):
        check_speculative(cfg(parallel_drafting=True))
    with pytest.raises(ValueError, match="method='eagle'.*gdn_graphs': False"):
        check_speculative(cfg(method="eagle"))
    with pytest.raises(ValueError, match=r"\[1, 63\]"):
        check_speculative(cfg(num_speculative_tokens=0))


@pytest.mark.vllm
def test_tiny_mtp_checkpoint_loads_into_vllms_qwen3_next_mtp(vllm_cpu, tiny_mtp, monkeypatch):
    """vLLM's own draft model class (our subclass builds it while the mode reads "align") loads
    every one of its parameters from the checkpoint's ``mtp.*`` tensors (and the shared
    embed_tokens / lm_head), each equal to its source."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.layers import activation
    from vllm.model_executor.models.registry import ModelRegistry

    from gdn_graphs.vllm.v0_26.model import Qwen3NextMTPAll

    # vLLM's CPU build here has no compiled ops; SiluAndMul's __init__ looks one up
    monkeypatch.setattr(activation.SiluAndMul, "__init__", lambda self, *a, **k:
                        torch.nn.Module.__init__(self))
    cfg = _engine_config(tiny_mtp, enable_prefix_caching=True, max_model_len=4096,
                         speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    draft = dataclasses.replace(cfg, model_config=cfg.speculative_config.draft_model_config)
    with set_current_vllm_config(draft):
        if not torch.distributed.is_initialized():
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method="tcp://127.0.0.1:29537")
        ps.ensure_model_parallel_initialized(1, 1)
        cls, _ = ModelRegistry.resolve_model_cls(draft.model_config.architectures,
                                                 draft.model_config)
        assert cls is Qwen3NextMTPAll
        model = cls(vllm_config=draft)
        ck = {}
        for f in ("model.safetensors", "model-mtp.safetensors"):
            ck.update(load_file(f"{tiny_mtp}/{f}"))
        loaded = model.load_weights(iter(ck.items()))
    params = dict(model.named_parameters())
    # vLLM reports the fused experts without their routed_experts module
    loaded = {n.replace("experts.w", "experts.routed_experts.w") for n in loaded}
    assert set(params) <= loaded, sorted(set(params) - loaded)
    src = {n[len("mtp."):]: t for n, t in ck.items() if n.startswith("mtp.")}
    assert torch.equal(params["model.fc.weight"], src["fc.weight"])
    assert torch.equal(params["lm_head.weight"], ck["lm_head.weight"])
    assert torch.equal(params["model.embed_tokens.weight"], ck["model.embed_tokens.weight"])
    attn = "layers.0.self_attn."
    qkv = torch.cat([src[f"{attn}{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(params[f"model.{attn}qkv_proj.weight"], qkv)
    w13 = params["model.layers.0.mlp.experts.routed_experts.w13_weight"]
    for e in range(w13.shape[0]):
        gate_up = torch.cat([src[f"layers.0.mlp.experts.{e}.{p}_proj.weight"]
                             for p in ("gate", "up")])
        assert torch.equal(w13[e], gate_up), e
    for norm in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        assert torch.equal(params[f"model.{norm}.weight"], src[f"{norm}.weight"])


@pytest.mark.vllm
def test_tiny_eagle3_head_loads_into_vllms_eagle3_llama(vllm_cpu, tiny_eagle3, monkeypatch):
    """vLLM's Eagle3LlamaForCausalLM, built for the tiny target, takes every tensor of the head
    written by ``tools/tiny_model.py --eagle3-for`` (no embed_tokens: vLLM shares the
    target's), each equal to its source: the fc over three target hidden states, the first
    layer's q/k/v over the 2 * hidden concatenation, the MLP, norms and lm_head."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.layers import activation
    from vllm.model_executor.models.registry import ModelRegistry

    monkeypatch.setattr(activation.SiluAndMul, "__init__", lambda self, *a, **k:
                        torch.nn.Module.__init__(self))
    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, max_model_len=4096,
                         speculative_config=_eagle3(tiny_eagle3))
    dm = cfg.speculative_config.draft_model_config
    with set_current_vllm_config(cfg):
        if not torch.distributed.is_initialized():
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method="tcp://127.0.0.1:29537")
        ps.ensure_model_parallel_initialized(1, 1)
        cls, _ = ModelRegistry.resolve_model_cls(dm.architectures, dm)
        assert cls.__name__ == "Eagle3LlamaForCausalLM"
        model = cls(vllm_config=cfg)
        src = load_file(f"{tiny_eagle3}/model.safetensors")
        model.load_weights(iter(src.items()))
    params = dict(model.named_parameters())
    H = cfg.model_config.hf_config.hidden_size
    assert params["model.fc.weight"].shape == (H, 3 * H)
    assert torch.equal(params["model.fc.weight"], src["fc.weight"])
    assert torch.equal(params["lm_head.weight"], src["lm_head.weight"])
    assert torch.equal(params["model.norm.weight"], src["norm.weight"])
    m, layer = "midlayer.", "model.layers.0."
    qkv = torch.cat([src[f"{m}self_attn.{p}_proj.weight"] for p in "qkv"])
    assert qkv.shape[1] == 2 * H
    assert torch.equal(params[f"{layer}self_attn.qkv_proj.weight"], qkv)
    assert torch.equal(params[f"{layer}self_attn.o_proj.weight"], src[f"{m}self_attn.o_proj.weight"])
    gate_up = torch.cat([src[f"{m}mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(params[f"{layer}mlp.gate_up_proj.weight"], gate_up)
    assert torch.equal(params[f"{layer}mlp.down_proj.weight"], src[f"{m}mlp.down_proj.weight"])
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        assert torch.equal(params[f"{layer}{norm}.weight"], src[f"{m}{norm}.weight"])
    assert torch.equal(params["draft_id_to_target_id"], src["d2t"])
    # every parameter but the embedding vLLM shares from the target came from the head
    named = {"model.fc.weight", "lm_head.weight", "model.norm.weight", "draft_id_to_target_id",
             f"{layer}self_attn.qkv_proj.weight", f"{layer}self_attn.o_proj.weight",
             f"{layer}mlp.gate_up_proj.weight", f"{layer}mlp.down_proj.weight",
             *(f"{layer}{n}.weight" for n in ("input_layernorm", "hidden_norm",
                                              "post_attention_layernorm"))}
    assert set(params) - named == {"model.embed_tokens.weight"}, sorted(set(params) - named)
