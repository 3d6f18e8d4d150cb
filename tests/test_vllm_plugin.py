"""The vLLM plugin's loading and configuration.

Tests without a mark need no vLLM (a stand-in module plays it). Tests marked ``vllm`` need vLLM
0.26 importable (no GPU: vLLM's CPU platform is forced); run them with ``pytest -m vllm`` after
``bash tools/install_vllm_cpu.sh``. They fail, never skip, when vLLM is missing.
"""

import importlib.metadata
import inspect
import sys
import types

import numpy as np
import pytest
import torch

import gdn_graphs.vllm as plugin
from gdn_graphs.constants import NO_SLOT


# ------------------------------------------------------------------ no vLLM needed

def test_entry_point_is_installed():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [e for e in eps if e.name == "gdn_graphs"]
    assert ours and ours[0].value == "gdn_graphs.vllm:register"


def test_unsupported_version_registers_nothing(monkeypatch, caplog):
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.25.1"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(plugin, "_registered", False)
    with caplog.at_level("ERROR", logger="vllm.gdn_graphs"):
        assert plugin.register() is False
    assert "0.25.1 is not supported" in caplog.text and "0.26.x" in caplog.text
    assert plugin._registered is False


def test_version_lines():
    assert plugin.hooks_module("0.26.0") == "gdn_graphs.vllm.v0_26"
    assert plugin.hooks_module("0.26.3.dev1+g123") == "gdn_graphs.vllm.v0_26"
    assert plugin.hooks_module("0.27.0") is None


def test_soft_switch():
    cfg = types.SimpleNamespace(additional_config={})
    assert plugin.enabled(cfg)
    cfg.additional_config = {"gdn_graphs": False}
    assert not plugin.enabled(cfg)
    cfg.additional_config = {"gdn_graphs": True, "other": 1}
    assert plugin.enabled(cfg)


# ------------------------------------------------------------------ with vLLM (CPU platform)

@pytest.fixture(scope="module")
def vllm_cpu(tmp_path_factory):
    """vLLM with its CPU platform, the plugin registered, and a tiny Qwen3-Next config on disk."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # pragma: no cover - a failure, not a skip
        pytest.fail(f"vLLM is not importable ({e}); run tools/install_vllm_cpu.sh first")
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    assert plugin.register() is True
    from tools.tiny_model import make_tiny_qwen3_next

    path = make_tiny_qwen3_next(tmp_path_factory.mktemp("tiny") / "qwen3_next", dtype="float32",
                                weights=False)
    return str(path)


def _engine_config(path, **kw):
    from vllm.engine.arg_utils import EngineArgs

    kw.setdefault("max_model_len", 32768)
    kw.setdefault("dtype", "float32")
    return EngineArgs(model=path, skip_tokenizer_init=True, **kw).create_engine_config()


def _final_block_size(cfg):
    """What the GPU worker does once it knows the attention backend (TRITON_ATTN here)."""
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    Platform._align_hybrid_block_size.__func__(Platform, cfg, TritonAttentionBackend)
    return cfg.cache_config


@pytest.mark.vllm
def test_registry_and_config_map(vllm_cpu):
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.model_executor.models.registry import ModelRegistry

    from gdn_graphs.vllm.v0_26.config import _VLLM_CONFIG_HOOKS, MODEL_CLASSES, GDNAllConfig

    assert set(MODEL_CLASSES) == {"Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForConditionalGeneration"}
    for arch, cls in MODEL_CLASSES.items():
        assert MODELS_CONFIG_MAP[arch] is GDNAllConfig
        entry = ModelRegistry.models[arch]
        assert f"{entry.module_name}:{entry.class_name}" == cls
    # vLLM's own Qwen3.5 hook (state dtype from the checkpoint) is kept, to run before ours
    assert _VLLM_CONFIG_HOOKS["Qwen3_5ForConditionalGeneration"].__name__ == \
        "Qwen3_5ForConditionalGenerationConfig"
    assert "Qwen3NextForCausalLM" not in _VLLM_CONFIG_HOOKS


def _fake_engine_config(arch, caching=True, extra=None, **cache):
    """Just the fields the config hooks read (vLLM's Qwen3.5 cannot be imported without
    torchvision, which the CPU tier does not install, so no real ModelConfig for it)."""
    from types import SimpleNamespace as NS

    cc = dict(enable_prefix_caching=caching, mamba_cache_mode="none", mamba_block_size=None,
              user_specified_mamba_block_size=False, mamba_ssm_cache_dtype="auto",
              prefix_match_unit=None)
    cc.update(cache)
    text = NS(mamba_ssm_dtype="float32")
    return NS(model_config=NS(architecture=arch, hf_text_config=text), cache_config=NS(**cc),
              speculative_config=None, additional_config=extra or {})


@pytest.mark.vllm
@pytest.mark.parametrize("arch", ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"])
def test_qwen3_5_config_hook_runs_vllms_first(vllm_cpu, arch):
    """Our hook replaces vLLM's Qwen3.5 entry in MODELS_CONFIG_MAP and runs it first: the state
    dtype still comes from the checkpoint (float32 here), and the mode is ours."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    hook = MODELS_CONFIG_MAP[arch]
    cfg = _fake_engine_config(arch)
    hook.verify_and_update_config(cfg)
    cc = cfg.cache_config
    assert (cc.mamba_cache_mode, cc.mamba_block_size, cc.mamba_ssm_cache_dtype) == ("all", 64, "float32")
    cfg = _fake_engine_config(arch, extra={"gdn_graphs": False})
    hook.verify_and_update_config(cfg)
    assert (cfg.cache_config.mamba_cache_mode, cfg.cache_config.mamba_ssm_cache_dtype) == ("align", "float32")
    with pytest.raises(ValueError, match="multiple of 64"):
        hook.verify_and_update_config(_fake_engine_config(arch, mamba_block_size=96))


@pytest.mark.vllm
def test_qwen3_5_model_classes_build_in_align_mode_then_switch_on(vllm_cpu, monkeypatch):
    """Our Qwen3.5 classes, on stand-ins for vLLM's (whose module needs torchvision): the parent
    __init__ sees mode "align" (vLLM's refuses "all" there), the mode is "all" again afterwards,
    and switch_on_layers runs on the built model."""
    import torch.nn as nn

    seen = []

    class FakeParent(nn.Module):
        def __init__(self, *, vllm_config, prefix="model"):
            super().__init__()
            seen.append(vllm_config.cache_config.mamba_cache_mode)

    fake = types.ModuleType("vllm.model_executor.models.qwen3_5")
    fake.Qwen3_5ForConditionalGeneration = fake.Qwen3_5MoeForConditionalGeneration = FakeParent
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.qwen3_5", fake)
    monkeypatch.delitem(sys.modules, "gdn_graphs.vllm.v0_26.qwen3_5", raising=False)
    M = importlib.import_module("gdn_graphs.vllm.v0_26.qwen3_5")  # with the stand-in parents
    switched = []
    import gdn_graphs.vllm.v0_26.model as factory_module
    monkeypatch.setattr(factory_module, "switch_on_layers", lambda model, cfg: switched.append(model))
    try:
        for cls in (M.Qwen3_5AllForConditionalGeneration, M.Qwen3_5MoeAllForConditionalGeneration):
            assert cls.supports_mamba_prefix_caching is True
            assert cls.__name__ == FakeParent.__name__  # vLLM dispatches on class names
            assert {"vllm_config", "prefix"} <= set(inspect.signature(cls).parameters)
            cfg = _fake_engine_config("Qwen3_5ForConditionalGeneration", mamba_cache_mode="all")
            model = cls(vllm_config=cfg)
            assert seen[-1] == "align" and cfg.cache_config.mamba_cache_mode == "all"
            assert switched[-1] is model
            off = _fake_engine_config("x", mamba_cache_mode="all", extra={"gdn_graphs": False})
            cls(vllm_config=off)
            assert seen[-1] == "all"  # plugin off: vLLM's own refusal applies as it would
    finally:
        sys.modules.pop("gdn_graphs.vllm.v0_26.qwen3_5", None)


@pytest.mark.vllm
def test_prefix_caching_gives_all_mode_with_chunk_multiple_blocks(vllm_cpu):
    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True)
    cc = cfg.cache_config
    assert cc.mamba_cache_mode == "all" and cc.mamba_block_size == 64
    assert cfg.model_config.supports_mamba_prefix_caching
    cc = _final_block_size(cfg)
    assert cc.mamba_block_size % 64 == 0 and cc.block_size == cc.mamba_block_size


@pytest.mark.vllm
def test_prefix_caching_off_and_soft_off(vllm_cpu):
    cfg = _engine_config(vllm_cpu, enable_prefix_caching=False)
    assert cfg.cache_config.mamba_cache_mode == "none"
    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, additional_config={"gdn_graphs": False})
    assert cfg.cache_config.mamba_cache_mode == "align"  # vLLM's own mode


@pytest.mark.vllm
def test_bad_block_size_is_refused(vllm_cpu):
    with pytest.raises(Exception, match="multiple of 64"):
        _engine_config(vllm_cpu, enable_prefix_caching=True, mamba_block_size=96)


@pytest.mark.vllm
def test_hits_inside_a_block_are_refused(vllm_cpu):
    """prefix_match_unit=64 is a multiple of 64 but finer than the block (192 on a GPU): vLLM
    would hand out hits at 64-token boundaries whose GDN state nobody stored."""
    with pytest.raises(Exception, match="inside a block"):
        _engine_config(vllm_cpu, enable_prefix_caching=True, prefix_match_unit=64)


@pytest.mark.vllm
def test_layer_swap_and_backend(vllm_cpu):
    from vllm.model_executor.custom_op import op_registry_oot

    from gdn_graphs.vllm.v0_26 import model as L

    assert op_registry_oot["QwenGatedDeltaNetAttention"] is L.GDNGraphsQwenGDN
    L.install_layer()  # idempotent
    assert L.GDNGraphsBackend.get_builder_cls() is L.GDNGraphsBuilder
    assert L.Qwen3NextAllForCausalLM.supports_mamba_prefix_caching is True
    # vLLM dispatches on model.__class__.__name__ (the MTP drafter's load_model): keep its names
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.model_executor.models.qwen3_next_mtp import Qwen3NextMTP
    assert L.Qwen3NextAllForCausalLM.__name__ == Qwen3NextForCausalLM.__name__
    assert L.Qwen3NextMTPAll.__name__ == Qwen3NextMTP.__name__
    assert issubclass(L.Qwen3NextMTPAll, Qwen3NextMTP) and L.Qwen3NextMTPAll is not Qwen3NextMTP
    # vLLM's initialize_model passes prefix only to constructors whose signature names it
    assert {"vllm_config", "prefix"} <= set(inspect.signature(L.Qwen3NextAllForCausalLM).parameters)


@pytest.mark.vllm
def test_builder_plans_from_vllm_metadata(vllm_cpu):
    """GDNGraphsBuilder.build on vLLM's own CommonAttentionMetadata (CPU tensors): decode rows
    across and inside a block, a warm prefill with checkpoints, padding rows."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import MambaSpec

    from gdn_graphs.vllm.v0_26.model import GDNGraphsBuilder

    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, max_num_seqs=8,
                         max_num_batched_tokens=2048)
    B = 192
    spec = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=(torch.float32, torch.float32),
                     block_size=B, mamba_cache_mode="all")
    builder = GDNGraphsBuilder(spec, ["l0"], cfg, torch.device("cpu"))
    width = spec.max_num_blocks_per_req(cfg, cfg.model_config.max_model_len)
    table = torch.arange(1, 8 * width + 1, dtype=torch.int32).view(8, width)
    table[2, :2] = 0                       # freed blocks before the read column
    n = [B, 5, 2 * B + 10, 0]              # rows: decode across, decode inside, prefill, padding
    q = [1, 1, 400, 0]
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(q)]), dtype=torch.int32)
    seq = torch.tensor([a + b for a, b in zip(n, q)], dtype=torch.int32)
    m = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=4,
        num_actual_tokens=int(qsl[-1]), max_query_len=400, max_seq_len=int(seq.max()),
        block_table_tensor=table[:4], slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        _seq_lens_cpu=seq, _num_computed_tokens_cpu=torch.tensor(n, dtype=torch.int32))
    md = builder.build(0, m)
    assert md.num_decodes == 2 and md.num_prefill_tokens == 400 and md.num_prefills == 1
    assert md.step.num_decodes == 2 and md.step.host.num_prefills == 1
    assert md.step.decode_read.tolist()[:3] == [table[0, 0].item(), table[1, 0].item(), NO_SLOT]
    assert md.step.decode_write.tolist()[:3] == [table[0, 1].item(), table[1, 0].item(), NO_SLOT]
    # prefill row: n = 2B+10, q = 400 -> read col 2, write col 793 // B = 4, checkpoints at
    # positions 3B and 4B -> cols 2 and 3
    pre = md.step.prefill
    assert pre.read_slot[0].item() == table[2, 2].item()
    assert pre.write_slot[0].item() == table[2, 4].item()
    assert pre.ckpt_slots.tolist()[:3] == [table[2, 2].item(), table[2, 3].item(), NO_SLOT]
    # a capture build never touches a block
    cap = builder.build_for_cudagraph_capture(m.replace(
        query_start_loc_cpu=torch.arange(5, dtype=torch.int32), query_start_loc=torch.arange(5, dtype=torch.int32),
        seq_lens=torch.ones(4, dtype=torch.int32), _seq_lens_cpu=torch.ones(4, dtype=torch.int32),
        max_query_len=1, num_actual_tokens=4))
    assert cap.step.num_decodes == 4 and set(cap.step.decode_read.tolist()) == {NO_SLOT}
    assert set(cap.step.decode_write.tolist()) == {NO_SLOT}


@pytest.mark.vllm
def test_builders_of_one_model_share_one_planner(vllm_cpu):
    """vLLM makes a builder per GDN KV-cache group: those of one model find the model's
    GDNResources through the layers in the static forward context and share its planner (one
    host plan per step), each with its own slot buffers; another model's builders do not."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from gdn_graphs.vllm.builder import GDNResources
    from gdn_graphs.vllm.v0_26.model import GDNGraphsBuilder

    cfg = _engine_config(vllm_cpu, enable_prefix_caching=True, max_num_seqs=8,
                         max_num_batched_tokens=2048)
    spec = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=(torch.float32, torch.float32),
                     block_size=192, mamba_cache_mode="all")
    res = GDNResources(max_reqs=8, max_tokens=2048)
    ctx = cfg.compilation_config.static_forward_context
    for name in ("g0.l0", "g1.l0"):
        ctx[name] = types.SimpleNamespace(_gdn_resources=res)
    try:
        b0, b1 = (GDNGraphsBuilder(spec, [n], cfg, torch.device("cpu")) for n in ("g0.l0", "g1.l0"))
        other = GDNGraphsBuilder(spec, ["elsewhere"], cfg, torch.device("cpu"))
    finally:
        for name in ("g0.l0", "g1.l0"):
            ctx.pop(name)
    assert b0._steps.planner is b1._steps.planner is res.planner(
        192, spec.max_num_blocks_per_req(cfg, cfg.model_config.max_model_len), 0,
        torch.device("cpu"))
    assert b0._steps.slots is not b1._steps.slots
    assert other._steps.planner is not b0._steps.planner


@pytest.fixture(scope="module")
def vllm_dist(vllm_cpu):
    """vLLM's process groups for one CPU rank (layers read the tensor-parallel size)."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if not model_parallel_is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with set_current_vllm_config(_engine_config(vllm_cpu)):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            initialize_model_parallel(1, 1)
    return vllm_cpu


@pytest.mark.vllm
@pytest.mark.parametrize("extra,caching,want_on", [({}, True, True), ({}, False, True),
                                                   ({"gdn_graphs": False}, True, False)])
def test_layers_switched_on_only_when_the_plugin_runs(vllm_dist, extra, caching, want_on):
    """vLLM builds the layers while our model class shows it mode "align" (its own refusal of
    "all" reads the mode then): they must be switched on afterwards, or they silently fall back to
    vLLM's kernels on "all"-mode block tables (seen on the GPU once)."""
    import torch.nn as nn
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

    from gdn_graphs.vllm.v0_26.model import GDNGraphsBackend, GDNGraphsQwenGDN, switch_on_layers

    cfg = _engine_config(vllm_dist, enable_prefix_caching=caching, additional_config=extra)
    with set_current_vllm_config(cfg):
        layer = QwenGatedDeltaNetAttention(cfg.model_config.hf_text_config, cfg,
                                           prefix=f"model.layers.{int(caching)}{len(extra)}.linear_attn",
                                           gqa_interleaved_layout=True)
    assert type(layer) is GDNGraphsQwenGDN and layer._gdn_graphs is False
    assert switch_on_layers(nn.ModuleList([layer]), cfg) == int(want_on)
    assert layer.get_attn_backend() is (GDNGraphsBackend if want_on else GDNAttentionBackend)


@pytest.mark.vllm
def test_layerwise_nvtx_tracing_switches_our_ranges_on(vllm_dist, monkeypatch):
    """With vLLM's enable_layerwise_nvtx_tracing our per-layer ranges (gdn.core.*) come on too,
    so they nest inside vLLM's layer ranges."""
    import torch.nn as nn
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    from gdn_graphs import nvtx
    from gdn_graphs.vllm.v0_26.model import switch_on_layers

    events = []
    fake = types.SimpleNamespace(push=lambda name, payload=None: events.append(name),
                                 pop=lambda: None)
    monkeypatch.setattr(nvtx, "_default_backend", lambda: fake)
    cfg = _engine_config(vllm_dist, enable_prefix_caching=True)
    cfg.observability_config.enable_layerwise_nvtx_tracing = True
    with set_current_vllm_config(cfg):
        layer = QwenGatedDeltaNetAttention(cfg.model_config.hf_text_config, cfg,
                                           prefix="model.layers.77.linear_attn",
                                           gqa_interleaved_layout=True)
    try:
        assert switch_on_layers(nn.ModuleList([layer]), cfg) == 1
        assert nvtx.enabled()
        with nvtx.range("gdn.core", 0):
            pass
        assert events == ["gdn.core"]
    finally:
        nvtx.enable(False)


@pytest.mark.vllm
@pytest.mark.parametrize("size,ours,theirs", [("tiny", 192, 144), ("full", 576, 544)])
def test_block_sizes_of_both_layouts(vllm_cpu, tmp_path, size, ours, theirs, monkeypatch):
    """With CUDA's default attention block (16) and TRITON_ATTN: the plugin's block is the smallest
    multiple of 64 holding a state page, vLLM's own "align" mode the smallest multiple of 16
    (the full-size numbers are the Qwen3-Next-80B-A3B layout in bf16)."""
    from tools.tiny_model import write_full_size_config

    # vLLM's CPU platform makes the SSM state float32 where the CPU has AMX tiles (its own CPU
    # kernels need it), which doubles the state page; the layouts here are the GPU's
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)

    path = vllm_cpu if size == "tiny" else str(write_full_size_config(tmp_path / "full"))
    kw = dict(enable_prefix_caching=True, block_size=16)
    if size == "full":
        kw.update(load_format="dummy", dtype="bfloat16")
    got = {}
    for name, extra in (("ours", {}), ("theirs", {"gdn_graphs": False})):
        cfg = _engine_config(path, additional_config=extra, **kw)
        got[name] = _final_block_size(cfg).block_size
    assert got == {"ours": ours, "theirs": theirs}
