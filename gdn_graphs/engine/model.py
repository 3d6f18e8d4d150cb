"""A small hybrid GatedDeltaNet model with seeded random weights (Qwen3-Next's GDN layer).

    embedding -> N x [ RMSNorm -> GDNLayer -> +residual,  RMSNorm -> gated MLP -> +residual ]
              -> final RMSNorm -> lm_head

GDNLayer (per token; Qwen3-Next's gated delta-net block):
    in_proj_qkv -> mixed qkv [T, conv_dim]   conv_dim = 2*HK*K + HV*V
    in_proj_z   -> z [T, HV*V]
    in_proj_ba  -> b, a [T, HV] each
    gdn_graphs::gdn_core(mixed qkv, a, b, conv, pools) -> o [T, HV, V]   (conv W=4 + SiLU, GDN)
    gated RMSNorm per value head: rmsnorm(o) * weight * silu(z)  -> out_proj -> [T, hidden]

The model works on a flat token batch (no batch dimension): the batch layout (which rows are
decodes, which are prefill spans, the slots) is published by the engine in a StepContext, see
gdn_graphs/runtime/core.py. Each layer owns one fp32 ssm pool [num_slots, HV, V, K] and one conv
pool [num_slots, conv_dim, W-1] (model dtype), created by ``allocate_pools``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

import gdn_graphs.runtime.core  # noqa: F401  (registers torch.ops.gdn_graphs.gdn_core)

__all__ = ["ModelConfig", "PRESETS", "GDNLayer", "HybridGDNModel", "preset"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_k_heads: int = 2        # HK
    num_v_heads: int = 4        # HV, a multiple of HK
    head_k_dim: int = 16        # K
    head_v_dim: int = 16        # V
    conv_kernel: int = 4        # W
    intermediate_size: int = 128
    rms_eps: float = 1e-6
    dtype: torch.dtype = torch.float32
    seed: int = 0

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def with_(self, **kw) -> "ModelConfig":
        return replace(self, **kw)


PRESETS = {
    "tiny": ModelConfig(),
    # Qwen3-Next-80B-A3B's GDN shapes (hidden 2048, HK 16, HV 32, K = V = 128, conv 4) with 36
    # GDN layers; a dense MLP of ~1024 stands in for the MoE (active experts ~ 512 x 10 + shared)
    # and the vocabulary is cut to 32768 to save memory (the lm_head is outside the GDN story).
    "qwen3-next": ModelConfig(vocab_size=32768, hidden_size=2048, num_layers=36, num_k_heads=16,
                              num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                              intermediate_size=1024),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name].with_(**overrides)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class GDNLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        H, HV, V = cfg.hidden_size, cfg.num_v_heads, cfg.head_v_dim
        kw = dict(bias=False, dtype=cfg.dtype)
        self.in_proj_qkv = nn.Linear(H, cfg.conv_dim, **kw)
        self.in_proj_z = nn.Linear(H, HV * V, **kw)
        self.in_proj_ba = nn.Linear(H, 2 * HV, **kw)
        self.conv_weight = nn.Parameter(torch.zeros(cfg.conv_dim, cfg.conv_kernel, dtype=cfg.dtype))
        self.A_log = nn.Parameter(torch.zeros(HV, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(HV, dtype=torch.float32))
        self.norm_weight = nn.Parameter(torch.ones(V, dtype=cfg.dtype))
        self.out_proj = nn.Linear(HV * V, H, **kw)
        # Pools are non-persistent buffers (not in state_dict), set by HybridGDNModel.allocate_pools.
        self.register_buffer("ssm_pool", None, persistent=False)
        self.register_buffer("conv_pool", None, persistent=False)

    def forward(self, x):
        cfg = self.cfg
        T = x.shape[0]
        HV, V = cfg.num_v_heads, cfg.head_v_dim
        qkv = self.in_proj_qkv(x)
        z = self.in_proj_z(x)
        b, a = self.in_proj_ba(x).chunk(2, dim=-1)
        o = torch.ops.gdn_graphs.gdn_core(
            qkv, a.contiguous(), b.contiguous(), self.conv_weight, None, self.A_log, self.dt_bias,
            self.conv_pool, self.ssm_pool, self.layer_idx)
        # gated RMSNorm per value head, in fp32
        of = o.float()
        y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + cfg.rms_eps)
        y = y * self.norm_weight.float() * F.silu(z.view(T, HV, V).float())
        return self.out_proj(y.to(x.dtype).reshape(T, HV * V))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        kw = dict(bias=False, dtype=cfg.dtype)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, **kw)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, **kw)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int):
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.dtype)
        self.gdn = GDNLayer(cfg, i)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.dtype)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.gdn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class HybridGDNModel(nn.Module):
    """Flat-batch hybrid model. ``forward(input_ids [T]) -> hidden [T, hidden]`` (after the final
    norm); ``logits(hidden) -> [.., vocab]`` in fp32. Run it inside a StepContext."""

    def __init__(self, cfg: ModelConfig, device="cpu"):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=cfg.dtype)
        self.to(device)
        self.reset_parameters()
        self.num_slots = 0

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @torch.no_grad()
    def reset_parameters(self):
        """Seeded init, scaled so activations stay O(1) through the residual stream and the
        logits spread enough that greedy decoding does not collapse onto one token."""
        cfg = self.cfg
        dev = self.device
        gen = torch.Generator(device=dev).manual_seed(cfg.seed)

        def normal_(p, std):
            p.copy_(torch.randn(p.shape, generator=gen, device=dev, dtype=torch.float32) * std)

        normal_(self.embed.weight, 1.0)
        depth = 1.0 / math.sqrt(2 * cfg.num_layers)
        for blk in self.layers:
            g = blk.gdn
            normal_(g.in_proj_qkv.weight, 1.0 / math.sqrt(cfg.hidden_size))
            normal_(g.in_proj_z.weight, 1.0 / math.sqrt(cfg.hidden_size))
            normal_(g.in_proj_ba.weight, 1.0 / math.sqrt(cfg.hidden_size))
            normal_(g.conv_weight, 1.0 / math.sqrt(cfg.conv_kernel))
            # Qwen3-Next: A ~ U(1, 16) -> A_log = log A; dt_bias so that softplus(dt) ~ 1e-3..1e-1
            u = torch.rand(cfg.num_v_heads, generator=gen, device=dev)
            g.A_log.copy_(torch.log(1 + 15 * u))
            dt = torch.exp(torch.rand(cfg.num_v_heads, generator=gen, device=dev)
                           * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            g.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            normal_(g.out_proj.weight, depth / math.sqrt(cfg.num_v_heads * cfg.head_v_dim))
            normal_(blk.mlp.gate_up.weight, 1.0 / math.sqrt(cfg.hidden_size))
            normal_(blk.mlp.down.weight, depth / math.sqrt(cfg.intermediate_size))
        normal_(self.lm_head.weight, 3.0 / math.sqrt(cfg.hidden_size))

    def allocate_pools(self, num_slots: int, ssm_dtype=torch.float32):
        """One ssm pool [num_slots, HV, V, K] and one conv pool [num_slots, conv_dim, W-1] per
        layer, zero-filled. Replaces existing pools (graphs captured on old pools are stale)."""
        cfg = self.cfg
        for blk in self.layers:
            g = blk.gdn
            g.ssm_pool = torch.zeros(num_slots, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim,
                                     dtype=ssm_dtype, device=self.device)
            g.conv_pool = torch.zeros(num_slots, cfg.conv_dim, cfg.conv_kernel - 1,
                                      dtype=cfg.dtype, device=self.device)
        self.num_slots = num_slots

    def pool_bytes_per_slot(self) -> int:
        cfg = self.cfg
        ssm = cfg.num_v_heads * cfg.head_v_dim * cfg.head_k_dim * 4
        conv = cfg.conv_dim * (cfg.conv_kernel - 1) * torch.finfo(cfg.dtype).bits // 8
        return (ssm + conv) * cfg.num_layers

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for blk in self.layers:
            x = blk(x)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
