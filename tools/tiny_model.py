"""A tiny random Qwen3-Next checkpoint for tests and demos (no hub, no tokenizer), and tiny
Qwen3.5 configs (config.json only, for vLLM's ``load_format="dummy"``).

Layout (issue 5): hidden 256, 4 layers with the 4th full attention, linear-attention heads 4 key /
8 value of dim 64, 4 experts, max_position_embeddings 32768. Prompts are passed as token ids.
Qwen3.5 gets the same text layout (experts only in its MoE variant) and a one-block vision tower.

``--mtp`` adds one multi-token-prediction layer (``num_nextn_predict_layers = 1``, what vLLM's
``qwen3_next_mtp`` reads) with random weights under the names vLLM's ``Qwen3NextMTP`` loads:
``mtp.fc`` [hidden, 2 * hidden], ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``,
``mtp.norm`` and ``mtp.layers.0.*``, a full-attention MoE decoder layer laid out as the model's
own (vLLM maps ``mtp.`` to its draft model's ``model.`` and shares ``embed_tokens`` and
``lm_head`` with the target).

``--eagle3-for TARGET`` writes a tiny EAGLE-3 draft head for the checkpoint at TARGET instead
(vLLM speculative method ``eagle3``, ``speculative_config={"method": "eagle3", "model": PATH}``):
a one-layer Llama head with random weights under the names vLLM's ``Eagle3LlamaForCausalLM``
loads (``midlayer.*`` with q/k/v taking the 2 * hidden concatenation of embedding and hidden
state, ``fc`` [hidden, 3 * hidden] over the target's three auxiliary hidden states, ``norm``,
``lm_head``, ``d2t`` zeros (the draft vocabulary is the target's); no ``embed_tokens``: vLLM
shares the target's), sized after TARGET's config.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["tiny_config", "full_size_config", "make_tiny_qwen3_next", "write_full_size_config",
           "tiny_qwen3_5_config", "write_tiny_qwen3_5_config", "mtp_weights",
           "make_tiny_eagle3_head"]

_TEXT = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
             layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
             linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=32768)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                shared_expert_intermediate_size=128)


def tiny_config(dtype: str = "bfloat16", vocab_size: int = 4096):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=vocab_size, **_TEXT, **_EXPERTS, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False, torch_dtype=dtype, architectures=["Qwen3NextForCausalLM"])


def tiny_qwen3_5_config(dtype: str = "bfloat16", moe: bool = False, vocab_size: int = 4096,
                        ssm_dtype: str | None = None, mtp: bool = False):
    """Qwen3.5 (``moe``: Qwen3.5-MoE) with the tiny text layout above and a one-block vision tower.
    ``ssm_dtype``: the checkpoint's ``mamba_ssm_dtype`` (vLLM's own config hook reads it).
    ``mtp``: one MTP layer (``mtp_num_hidden_layers``, what vLLM's ``qwen3_5_mtp`` reads; with
    ``load_format="dummy"`` its weights are random too)."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    text = dict(_TEXT, vocab_size=vocab_size, **(_EXPERTS if moe else {}))
    if ssm_dtype is not None:
        text["mamba_ssm_dtype"] = ssm_dtype
    if mtp:
        text["mtp_num_hidden_layers"] = 1
    vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256)
    cls, arch = ((Qwen3_5MoeConfig, "Qwen3_5MoeForConditionalGeneration") if moe else
                 (Qwen3_5Config, "Qwen3_5ForConditionalGeneration"))
    extra = {"mtp_num_hidden_layers": 1} if mtp else {}  # (vLLM's n_predict reads the top level)
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=False, torch_dtype=dtype,
               architectures=[arch], **extra)


def write_tiny_qwen3_5_config(path: str | Path, **kw) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tiny_qwen3_5_config(**kw).save_pretrained(path)
    return path


def full_size_config(dtype: str = "bfloat16", layers: int | None = None):
    """transformers' default Qwen3NextConfig: the Qwen3-Next-80B-A3B layout (48 layers, every 4th
    full attention; GDN heads 16 key / 32 value of dim 128; 512 experts). For random-weight runs
    (vLLM ``load_format="dummy"``): only config.json is written. ``layers`` (a multiple of 4) keeps
    the layout with fewer layers, so the model fits one GPU (8 layers: ~26 GB in bf16) while vLLM
    still forms its KV-cache groups as for 48 (one attention group, three GDN groups)."""
    from transformers import Qwen3NextConfig

    if layers is None:
        return Qwen3NextConfig(torch_dtype=dtype, architectures=["Qwen3NextForCausalLM"])
    if layers < 4 or layers % 4:
        raise ValueError(f"layers must be a positive multiple of 4 (every 4th is attention), got {layers}")
    types = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
    return Qwen3NextConfig(torch_dtype=dtype, architectures=["Qwen3NextForCausalLM"],
                           num_hidden_layers=layers, layer_types=types)


def write_full_size_config(path: str | Path, dtype: str = "bfloat16", layers: int | None = None) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    full_size_config(dtype, layers).save_pretrained(path)
    return path


def make_tiny_qwen3_next(path: str | Path, dtype: str = "bfloat16", seed: int = 0,
                         weights: bool = True, mtp: bool = False) -> Path:
    """Write config.json (and random weights unless ``weights=False``) to ``path``; ``mtp``: with
    one MTP layer (module docstring)."""
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(dtype)
    if mtp:
        cfg.num_nextn_predict_layers = 1
    if not weights:
        cfg.save_pretrained(path)
        return path
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    if mtp:  # shaped after the tensors as saved (per-expert names, as vLLM loads them)
        _add_tensors(path, mtp_weights(_saved_tensors(path), cfg, seed))
    (path / "gdn_graphs_tiny.json").write_text(json.dumps({"seed": seed, "dtype": dtype,
                                                           "mtp": mtp}))
    return path


def mtp_weights(state: dict, cfg, seed: int = 0) -> dict:
    """Random MTP tensors named as vLLM's Qwen3NextMTP loads them, shaped after the model's own
    last (full-attention) layer; norms copied (Qwen3-Next's RMSNorm scales by 1 + weight)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    H = cfg.hidden_size
    last = f"model.layers.{cfg.num_hidden_layers - 1}."
    if cfg.layer_types[-1] != "full_attention":
        raise ValueError("the MTP layer copies the layout of a full-attention last layer")
    like = state[f"{last}input_layernorm.weight"]

    def rand(shape):
        return (torch.randn(shape, generator=gen) * 0.02).to(like.dtype)

    out = {"mtp.fc.weight": rand((H, 2 * H))}
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = state["model.norm.weight"].clone()
    for name, t in state.items():
        if name.startswith(last):
            rest = name[len(last):]
            out[f"mtp.layers.0.{rest}"] = t.clone() if "norm" in rest else rand(t.shape)
    return out


def make_tiny_eagle3_head(path: str | Path, target: str | Path, dtype: str | None = None,
                          seed: int = 0) -> Path:
    """Write an EAGLE-3 draft head for the checkpoint at ``target`` to ``path`` (module
    docstring): config.json and model.safetensors. ``dtype`` defaults to the target's."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, LlamaConfig

    tc = AutoConfig.from_pretrained(str(target))
    tc = tc.get_text_config() if hasattr(tc, "get_text_config") else tc
    dtype = dtype or str(getattr(tc, "dtype", None) or getattr(tc, "torch_dtype", None) or "bfloat16")
    dtype = dtype.replace("torch.", "")
    H, V = tc.hidden_size, tc.vocab_size
    nh, nkv, hd = tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim
    cfg = LlamaConfig(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                      num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd, vocab_size=V,
                      max_position_embeddings=tc.max_position_embeddings,
                      rms_norm_eps=tc.rms_norm_eps, tie_word_embeddings=False, torch_dtype=dtype,
                      architectures=["LlamaForCausalLMEagle3"])
    # what vLLM's Eagle3 LlamaModel reads beyond a LlamaConfig: the target's hidden size (the
    # fc input is three of its hidden states) and the draft vocabulary (the target's: no d2t map)
    cfg.target_hidden_size, cfg.draft_vocab_size = H, V
    # the three target layers whose inputs feed fc. Left unset, vLLM takes the model's default,
    # (2, L // 2, L - 3) for L layers, which for the tiny models' 4 layers is (2, 2, 1): two
    # distinct layers, so fc got 2 H features for its 3 H inputs and the engine died on its
    # first request (H200, 2026-12-02). Real heads name their layers the same way.
    L = tc.num_hidden_layers
    if L < 3:
        raise ValueError(f"an EAGLE-3 head reads three distinct target layers; the target has {L}")
    cfg.eagle_aux_hidden_state_layer_ids = sorted({1, L // 2, L - 1} if L >= 4 else {0, 1, 2})
    gen = torch.Generator().manual_seed(seed + 2)
    dt = getattr(torch, dtype)

    def rand(*shape):
        return (torch.randn(shape, generator=gen) * 0.02).to(dt)

    ones = torch.ones(H, dtype=dt)  # Llama's RMSNorm scales by its weight
    m = "midlayer."
    tensors = {f"{m}self_attn.q_proj.weight": rand(nh * hd, 2 * H),
               f"{m}self_attn.k_proj.weight": rand(nkv * hd, 2 * H),
               f"{m}self_attn.v_proj.weight": rand(nkv * hd, 2 * H),
               f"{m}self_attn.o_proj.weight": rand(H, nh * hd),
               f"{m}mlp.gate_proj.weight": rand(2 * H, H), f"{m}mlp.up_proj.weight": rand(2 * H, H),
               f"{m}mlp.down_proj.weight": rand(H, 2 * H),
               "fc.weight": rand(H, 3 * H), "lm_head.weight": rand(V, H),
               # draft id -> target id offsets (vLLM adds them to the draft ids): the identity
               "d2t": torch.zeros(V, dtype=torch.int64)}
    for norm in (f"{m}input_layernorm", f"{m}hidden_norm", f"{m}post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = ones.clone()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _saved_tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(path.glob("model*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _add_tensors(path: Path, tensors: dict) -> None:
    """Write ``tensors`` as one more safetensors file and list them in the index (vLLM and
    transformers read every file the index names)."""
    from safetensors.torch import save_file

    name = "model-mtp.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / name),
              metadata={"format": "pt"})
    index_path = path / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:  # one unsharded file: make an index naming both
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in f.keys()}}
    index["weight_map"].update({k: name for k in tensors})
    index_path.write_text(json.dumps(index, indent=2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default; --eagle3-for: the target's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config-only", action="store_true")
    ap.add_argument("--full-size", action="store_true",
                    help="the 80B-A3B layout, config.json only (for load_format='dummy')")
    ap.add_argument("--layers", type=int, default=None,
                    help="with --full-size: that many layers (a multiple of 4), to fit one GPU")
    ap.add_argument("--mtp", action="store_true",
                    help="with one MTP layer (vLLM speculative method 'mtp' / 'qwen3_next_mtp')")
    ap.add_argument("--eagle3-for", metavar="TARGET", default=None,
                    help="an EAGLE-3 draft head for the checkpoint at TARGET instead (vLLM "
                         "speculative method 'eagle3'; dtype: the target's unless --dtype)")
    ap.add_argument("--qwen3-5", choices=("dense", "moe"), default=None,
                    help="a tiny Qwen3.5 config.json instead (for load_format='dummy')")
    a = ap.parse_args(argv)
    if not a.eagle3_for:
        a.dtype = a.dtype or "bfloat16"
    if a.mtp and a.full_size:
        ap.error("--mtp goes with the tiny models only")
    if a.eagle3_for and (a.mtp or a.full_size or a.qwen3_5 or a.config_only or a.layers):
        ap.error("--eagle3-for writes a draft head only (its size comes from TARGET): no --mtp, "
                 "--full-size, --layers, --qwen3-5 or --config-only with it")
    if a.eagle3_for:
        print(make_tiny_eagle3_head(a.path, a.eagle3_for, a.dtype, a.seed))
    elif a.qwen3_5:
        print(write_tiny_qwen3_5_config(a.path, dtype=a.dtype, moe=a.qwen3_5 == "moe",
                                        mtp=a.mtp))
    elif a.layers is not None and not a.full_size:
        ap.error("--layers goes with --full-size")
    elif a.full_size:
        print(write_full_size_config(a.path, a.dtype, a.layers))
    else:
        print(make_tiny_qwen3_next(a.path, a.dtype, a.seed, weights=not a.config_only,
                                   mtp=a.mtp))


if __name__ == "__main__":
    main()
