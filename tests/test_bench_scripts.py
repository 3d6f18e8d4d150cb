"""CPU checks of the benchmark scripts' bookkeeping (profiling/bench_prefill.py, bench_decode.py):
argument parsing, and the FlashInfer columns run end to end in --cpu-dry-run against a plain torch
stand-in that follows FlashInfer 0.6.14's documented conventions (alpha = exp(g) in linear space,
q and k not normalised by the kernel, states [N, HV, V, K], checkpoint i of a sequence after
(i + 1) * every tokens at checkpoint_cu_starts[seq] + i; decode pools [slots, HV, V, K] with
read/write indices). The stand-in checks the script's indexing, not FlashInfer: the GPU run
compares the real kernels with ours."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_script(name):
    """A fresh copy of profiling/<name>.py (the dry runs rewrite module globals)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "profiling" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _expand(x, hv):
    return x.repeat_interleave(hv // x.shape[-2], dim=-2)


def fake_fi_prefill(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                    output=None, output_state=None, state_checkpoints=None,
                    checkpoint_cu_starts=None, checkpoint_every_n_tokens=0, use_cp="auto"):
    T, HV, V = v.shape
    K = q.shape[-1]
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert g.dtype == beta.dtype == torch.float32 and cu_seqlens.dtype == torch.int64
    scale = K ** -0.5 if scale is None else scale
    qh, kh = _expand(q.float(), HV) * scale, _expand(k.float(), HV)
    cu = cu_seqlens.tolist()
    out = torch.zeros(T, HV, V) if output is None else output
    fin = torch.zeros(len(cu) - 1, HV, V, K) if output_state is None else output_state
    for n in range(len(cu) - 1):
        S = torch.zeros(HV, V, K) if initial_state is None else initial_state[n].float().clone()
        for t in range(cu[n], cu[n + 1]):
            S = S * g[t][:, None, None]
            u = beta[t][:, None] * (v[t].float() - torch.einsum("hvk,hk->hv", S, kh[t]))
            S = S + u[:, :, None] * kh[t][:, None, :]
            out[t] = torch.einsum("hvk,hk->hv", S, qh[t]).to(out.dtype)
            end = t + 1 - cu[n]
            if checkpoint_every_n_tokens and end % checkpoint_every_n_tokens == 0:
                state_checkpoints[int(checkpoint_cu_starts[n]) + end // checkpoint_every_n_tokens - 1] = S
        fin[n] = S
    return (out, fin) if output_final_state else out


def test_prefill_args_and_help(capsys):
    bp = load_script("bench_prefill")
    a = bp.parse_args(["--out", "x", "--tp", "2", "--only", "ours,fi", "--shapes", "1x8192,4x16384"])
    assert a.tp == [2] and a.only == ["ours", "fi"] and a.shapes == [(1, 8192), (4, 16384)]
    assert bp.parse_args(["--out", "x", "--no-fi", "--no-vllm"]).only == ["ours", "fla"]
    for bad in (["--tp", "3"], ["--only", "flashinfer"], ["--shapes", "8x100"]):
        with pytest.raises(SystemExit):
            bp.parse_args(["--out", "x", *bad])
    with pytest.raises(SystemExit) as e:
        bp.parse_args(["--help"])
    assert e.value.code == 0 and "FlashInfer" in capsys.readouterr().out


def test_prefill_dry_run_with_flashinfer_stand_in(tmp_path, capsys):
    bp = load_script("bench_prefill")

    def load_fi():
        return dict(prefill=fake_fi_prefill, version="stand-in"), None

    load_fi.dry_run_ok = True
    bp.load_fi = load_fi
    res = bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-sweep", "--only", "fi",
                   "--shapes", "2x128", "--tp", "1,2"])
    text = capsys.readouterr().out
    assert set(res["shapes"]) == {"2x128", "2x128 tp2"}
    for name, e in res["shapes"].items():
        fi = e["fi"]
        assert "error" not in fi, fi
        assert fi["off"]["rel_diff_out"] < 2e-2 and fi["off"]["rel_diff_state"] < 1e-2, fi["off"]
        for mode in ("B=256", "B=1024"):  # 64 and 128 in the dry run
            p = fi[f"pool {mode}"]
            assert "check_error" not in p, p
            assert p["rel_diff_pool"] < 1e-2 and p["rel_diff_out"] < 2e-2, (mode, p)
        # 2 sequences of 128: B = 64 stores 1 checkpoint each inside the span, FlashInfer 2
        assert fi["ckpt B=256"]["checkpoints"] == 4 and fi["pool B=256"]["slots_written"] == 4
        assert fi["pool B=1024"]["slots_written"] == 2
    assert "FI pool B=256" in text and "FI prep" in text
    assert (tmp_path / "bench_prefill.json").exists()


def fake_vllm_prefill(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                      cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                      use_qk_l2norm_in_kernel=False, core_attn_out=None):
    """vLLM's Triton convention: [1, T, H, D], g in log space, l2norm in the kernel."""
    def l2n(x):
        x = x.float()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    q, k = (l2n(q[0]), l2n(k[0])) if use_qk_l2norm_in_kernel else (q[0], k[0])
    o, ht = fake_fi_prefill(q.contiguous(), k.contiguous(), v[0].contiguous(), g=g[0].float().exp(),
                            beta=beta[0].float(), scale=scale, initial_state=initial_state,
                            output_final_state=True, cu_seqlens=cu_seqlens.long(),
                            output=torch.zeros(v.shape[1:], dtype=v.dtype))
    return o[None], ht


def test_prefill_dry_run_with_vllm_stand_in(tmp_path):
    bp = load_script("bench_prefill")

    def load_vllm():
        return dict(fn=fake_vllm_prefill, module="stand_in", version="stand-in"), None

    load_vllm.dry_run_ok = True
    bp.load_vllm = load_vllm
    res = bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-sweep", "--only", "vllm",
                   "--shapes", "2x64", "--tp", "1"])
    r = res["shapes"]["2x64"]["vllm"]
    assert r["rel_diff_out"] < 2e-2 and r["rel_diff_state"] < 1e-2, r  # ours: tf32 dots
    assert r["notes"] and "chunk indices not precomputed" in r["notes"][0]
