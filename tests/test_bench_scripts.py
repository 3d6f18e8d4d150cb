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

from test_vllm_plugin import vllm_cpu  # noqa: F401 (a fixture: vLLM's CPU platform)

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
    assert bp.parse_args(["--out", "x", "--only", "ours,vllm_fi"]).only == ["ours", "vllm_fi"]
    assert "vllm_fi" in bp.parse_args(["--out", "x"]).only
    assert bp.parse_args(["--out", "x", "--no-fi"]).only == ["ours", "fla", "vllm"]  # vllm_fi needs FI
    for bad in (["--tp", "3"], ["--only", "flashinfer"], ["--shapes", "8x100"]):
        with pytest.raises(SystemExit):
            bp.parse_args(["--out", "x", *bad])
    with pytest.raises(SystemExit) as e:
        bp.parse_args(["--help"])
    assert e.value.code == 0 and "FlashInfer" in capsys.readouterr().out


def test_prefill_sweep_runs_on_the_first_shape(tmp_path, capsys):
    """--sweep-only times every knob config on the first of --shapes (a batch of several
    sequences, where the default's knobs were never swept), each in a child process, each
    checked against the default config's output."""
    import json
    bp = load_script("bench_prefill")
    bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--sweep-only", "--shapes", "2x64"])
    sw = json.loads((tmp_path / "bench_prefill_sweep.json").read_text())
    assert sw["shape"] == "2x64" and len(sw["seq"]) == len(bp.SWEEP) >= 2
    assert all("ms" in r and r["rel_diff_vs_default"] < 1e-2 for r in sw["seq"]), sw["seq"]
    assert "knob sweep, 2x64 B=256" in capsys.readouterr().out


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
            via = fi[f"via {mode}"]  # ours on the stand-in: prep, gather, scatter included
            assert "check_error" not in via and "error" not in via, via
            assert via["rel_diff_pool"] < 1e-2 and via["rel_diff_out"] < 2e-2, (mode, via)
            assert via["slots_written"] == p["slots_written"] and via["vs_fi_off"] > 0
        # 2 sequences of 128: B = 64 stores 1 checkpoint each inside the span, FlashInfer 2
        assert fi["ckpt B=256"]["checkpoints"] == 4 and fi["pool B=256"]["slots_written"] == 4
        assert fi["pool B=1024"]["slots_written"] == 2
    assert "FI pool B=256" in text and "FI prep" in text
    assert "ours via FI B=256" in text and "vs FI off" in text and "via FI B=1024" in text
    for e in res["shapes"].values():  # every 64 (= B in the dry run): the same slots
        v = e["fi"]["via B=256 e64"]
        assert "check_error" not in v and v["rel_diff_pool"] < 1e-2, v
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


def fake_post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim,
                        apply_l2norm=True, output_g_exp=False):
    """vLLM 0.26's fused_post_conv_prep: [L, 2*H*K + HV*V] -> q, k [L, H, K] (l2-normalised),
    v [L, HV, V] contiguous, g = -exp(A_log) * softplus(a + dt_bias) and sigmoid(b) in fp32 [L, HV]."""
    L, H, K, V, HV = conv_output.shape[0], num_k_heads, head_k_dim, head_v_dim, A_log.shape[0]
    assert conv_output.shape[1] == 2 * H * K + HV * V and conv_output.is_contiguous()
    assert apply_l2norm and not output_g_exp  # what vLLM's prefill passes

    def l2n(x):
        x = x.float()
        return (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).to(conv_output.dtype)

    q = l2n(conv_output[:, :H * K].reshape(L, H, K))
    k = l2n(conv_output[:, H * K:2 * H * K].reshape(L, H, K))
    v = conv_output[:, 2 * H * K:].reshape(L, HV, V).contiguous()
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return q, k, v, g, torch.sigmoid(b.float())


def fi_accepting_int32(**kw):
    """FlashInfer casts cu_seqlens to int64 itself (vLLM passes query_start_loc, int32)."""
    assert kw["cu_seqlens"].dtype in (torch.int32, torch.int64)
    return fake_fi_prefill(**dict(kw, cu_seqlens=kw["cu_seqlens"].long()))


def fake_vllm_fi_wrapper(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                         use_qk_l2norm_in_kernel=True):
    """vLLM 0.26's fi_chunk_gated_delta_rule: [1, T, H, D] in, FlashInfer with alpha = exp(g)."""
    assert not use_qk_l2norm_in_kernel and initial_state.dtype == torch.float32
    o, ht = fi_accepting_int32(q=q[0].contiguous(), k=k[0].contiguous(), v=v[0].contiguous(),
                               g=g[0].float().exp(), beta=beta[0].float(), initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return o[None], ht


def _check_vllm_fi(res, text):
    for e in res["shapes"].values():
        r = e["vllm_fi"]
        assert "error" not in r and r["ms"] > 0 and "first_call_s" in r, r
        assert r["rel_diff_out"] < 2e-2 and r["rel_diff_state"] < 1e-2, r  # ours: tf32 dots
        assert r["rel_diff_state_T"] > 10 * r["rel_diff_state"], r  # the pool layout [V, K] matches
    assert "vLLM default (FI)" in text


def test_prefill_dry_run_with_vllm_fi_stand_in(tmp_path, capsys):
    bp = load_script("bench_prefill")

    def load_fi():
        return dict(prefill=fake_fi_prefill, version="stand-in"), None

    def load_vllm_fi():
        return dict(prep=fake_post_conv_prep, fn=fake_vllm_fi_wrapper, version="stand-in",
                    fi_version="stand-in"), None

    load_fi.dry_run_ok = load_vllm_fi.dry_run_ok = True
    bp.load_fi, bp.load_vllm_fi = load_fi, load_vllm_fi
    res = bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-sweep", "--only", "fi,vllm_fi",
                   "--shapes", "2x128", "--tp", "1"])
    text = capsys.readouterr().out
    _check_vllm_fi(res, text)
    assert res["shapes"]["2x128"]["vllm_fi"]["vs_fi_off"] > 0
    assert "vLLM default (FI)" in text.split("vs FI off")[1].splitlines()[0]
    assert "ours via FI / vLLM default (FI): via FI B=256" in text


def test_prefill_graph_ratios():
    """The "CUDA graphs" line: ours' replayed time against FlashInfer's replayed kernels and vLLM's
    replayed default sequence (> 1: ours faster); nothing where ours or FI's no-state replay is
    missing (a failed capture), and no vLLM figure where its replay is missing."""
    bp = load_script("bench_prefill")
    ours = {"B=256": {"ms_graph": 0.4}}
    fi = {"graph off_nocp": 0.2, "graph off": 0.3, "graph ckpt B=256": 0.24}
    line = bp.graph_ratios(ours, fi, {"ms": 0.9, "ms_graph": 0.5})
    assert "FI no states 0.200" in line and "ours / FI no states 0.50x" in line, line
    assert "ours / FI ckpt 0.60x" in line and "vLLM default 0.500" in line, line
    assert "ours / vLLM default 1.25x" in line, line
    assert "vLLM" not in bp.graph_ratios(ours, fi, {"ms": 0.9, "ms_graph": None})
    assert "vLLM" not in bp.graph_ratios(ours, fi)
    assert bp.graph_ratios({"B=256": {"ms_graph": None}}, fi) == ""
    assert bp.graph_ratios(ours, {"graph ckpt B=256": 0.24}) == ""
    line = bp.graph_ratio_bf16_pool({"B=256": {"ms_graph_bf16_pool": 0.25}}, {"ms_graph_bf16_pool": 0.3})
    assert line == "ours B=256 0.250 ms, vLLM default 0.300; ours / vLLM default 1.20x", line
    assert bp.graph_ratio_bf16_pool(ours, {"ms_graph_bf16_pool": 0.3}) == ""


@pytest.mark.vllm
def test_prefill_vllm_fi_without_flashinfer(vllm_cpu, tmp_path, capsys):
    """vLLM's CPU build imports, FlashInfer does not: the column says why and the bench goes on.
    (vllm_cpu sets vLLM's CPU platform first: a vLLM module imported before that keeps an
    unspecified platform, and the later vLLM tests fail.)"""
    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("FlashInfer is installed here")
    bp = load_script("bench_prefill")
    bp.load_vllm_fi.dry_run_ok = True  # the real loader, under --cpu-dry-run
    res = bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-sweep", "--only", "ours,vllm_fi",
                   "--shapes", "1x64", "--tp", "1"])
    assert res["vllm_fi_error"].startswith("FlashInfer: ModuleNotFoundError"), res["vllm_fi_error"]
    assert "vllm_fi" not in res["shapes"]["1x64"] and "ours" in res["shapes"]["1x64"]
    assert "vllm_fi: not compared: FlashInfer: " in capsys.readouterr().out


@pytest.mark.vllm
def test_prefill_vllm_fi_real_vllm_functions(vllm_cpu, tmp_path, capsys, monkeypatch):
    """vLLM's own fi_chunk_gated_delta_rule (plain torch around FlashInfer) with a FlashInfer
    stand-in in sys.modules, and the keywords handed to fused_post_conv_prep bound to its real
    signature (its Triton kernel cannot run here: vLLM's CPU build disables Triton, so the
    stand-in computes it): checks the names, order and layouts this script hands to vLLM."""
    import inspect
    import sys
    import types
    fi_mod = types.ModuleType("flashinfer")
    fi_mod.__version__ = "stand-in"
    fi_mod.gdn_prefill = types.ModuleType("flashinfer.gdn_prefill")
    fi_mod.gdn_prefill.chunk_gated_delta_rule = fi_accepting_int32
    monkeypatch.setitem(sys.modules, "flashinfer", fi_mod)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", fi_mod.gdn_prefill)
    bp = load_script("bench_prefill")
    real_loader = bp.load_vllm_fi

    def load_vllm_fi():
        vf, err = real_loader()
        assert err is None, err
        sig = inspect.signature(vf["prep"])

        def prep(*args, **kw):
            bound = sig.bind(*args, **kw)
            return fake_post_conv_prep(**bound.arguments)

        return dict(vf, prep=prep), None

    load_vllm_fi.dry_run_ok = True
    bp.load_vllm_fi = load_vllm_fi
    res = bp.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-sweep", "--only", "vllm_fi",
                   "--shapes", "2x64", "--tp", "1,2"])
    assert res["vllm_fi_error"] is None and res["vllm_fi_versions"]["flashinfer"] == "stand-in"
    _check_vllm_fi(res, capsys.readouterr().out)


def _decode_step(q, k, v, a, b, A_log, dt_bias, S, scale):
    """One token per row, fp32: q, k [B, HV, K] (expanded), v [B, HV, V], S [B, HV, V, K]."""
    def l2n(x):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    q, k = l2n(q.float()) * scale, l2n(k.float())
    g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    S = S.float() * g.exp()[..., None, None]
    u = beta[..., None] * (v.float() - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + u[..., None] * k[..., None, :]
    return torch.einsum("bhvk,bhk->bhv", S, q), S


def fake_fi_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,
                   use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                   output_state_indices=None):
    """FlashInfer's pretranspose pool decode: [B, 1, H, D] inputs, pool [slots, HV, V, K]."""
    assert state is None and use_qk_l2norm and initial_state.stride(-1) == 1
    B, _, H, K = q.shape
    HV = v.shape[2]
    rs = initial_state_indices.long()
    ws = rs if output_state_indices is None else output_state_indices.long()
    o, S = _decode_step(_expand(q[:, 0], HV), _expand(k[:, 0], HV), v[:, 0], a[:, 0], b[:, 0],
                        A_log, dt_bias, initial_state[rs], K ** -0.5 if scale is None else scale)
    initial_state[ws] = S.to(initial_state.dtype)
    output[:, 0] = o.to(output.dtype)
    return output, initial_state


def fake_vllm_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                     use_qk_l2norm_in_kernel=False):
    """vLLM's packed decode: one packed [B, 2 * H * K + HV * V] row per token, in place."""
    HV, V, K = initial_state.shape[1:]
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    B = mixed_qkv.shape[0]
    q = mixed_qkv[:, :H * K].reshape(B, H, K)
    k = mixed_qkv[:, H * K:2 * H * K].reshape(B, H, K)
    v = mixed_qkv[:, 2 * H * K:].reshape(B, HV, V)
    idx = ssm_state_indices.long()
    assert bool((idx > 0).all()), "vLLM reads index 0 as 'no state'"
    o, S = _decode_step(_expand(q, HV), _expand(k, HV), v, a, b, A_log, dt_bias, initial_state[idx], scale)
    initial_state[idx] = S.to(initial_state.dtype)
    out[:, 0] = o.to(out.dtype)
    return out, initial_state


def test_decode_args_and_help(capsys):
    bd = load_script("bench_decode")
    a = bd.parse_args(["--out", "x", "--tp", "2", "--pools", "bf16", "--only", "ours,fi",
                       "--batches", "1,4"])
    assert a.tp == [2] and a.pools == ["bf16"] and a.only == ["ours", "fi"] and a.batches == [1, 4]
    assert bd.parse_args(["--out", "x", "--no-fi", "--no-vllm"]).only == ["ours", "fla", "copy"]
    for bad in (["--tp", "4"], ["--pools", "fp16"], ["--only", "sglang"], ["--batches", "0"]):
        with pytest.raises(SystemExit):
            bd.parse_args(["--out", "x", *bad])
    with pytest.raises(SystemExit) as e:
        bd.parse_args(["--help"])
    assert e.value.code == 0 and "FlashInfer" in capsys.readouterr().out


def test_decode_dry_run_with_stand_ins(tmp_path, capsys):
    bd = load_script("bench_decode")

    def load_fi():
        return dict(fn=fake_fi_decode, version="stand-in"), None

    def load_vllm():
        return dict(fn=fake_vllm_decode, module="stand_in", version="stand-in"), None

    def failing_fi(**kw):  # a row that fails must be reported, not crash the bench
        raise TypeError("CuTe-DSL argument error (stand-in)")

    load_fi.dry_run_ok = load_vllm.dry_run_ok = True
    bd.load_fi_decode, bd.load_vllm_decode = load_fi, load_vllm
    res = bd.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-stack", "--no-sweep",
                   "--only", "ours,vllm,fi", "--batches", "2", "--batches-tp2", "2"])
    text = capsys.readouterr().out
    rows = res["columns"]
    assert {(r["tp"], r["pool"], r["column"]) for r in rows} == {
        (tp, p, c) for tp in (1, 2) for p in ("fp32", "bf16") for c in ("ours", "fi", "vllm")}
    for r in rows:
        assert "error" not in r and r["ms"] > 0, r
        if r["column"] != "ours":
            tol = 1e-5 if r["pool"] == "fp32" else 2e-2
            assert r["rel_diff_out"] < 2e-2 and r["rel_diff_state"] < tol, r
    assert "columns side by side" in text

    load_fi2 = lambda: (dict(fn=failing_fi, version="stand-in"), None)  # noqa: E731
    load_fi2.dry_run_ok = True
    bd.load_fi_decode = load_fi2
    res = bd.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-stack", "--no-sweep", "--tp", "1",
                   "--pools", "fp32", "--only", "fi", "--batches", "1"])
    (row,) = [r for r in res["columns"] if r["column"] == "fi"]
    assert "CuTe-DSL argument error" in row["error"] and "contiguous" in row["error"]
    assert "B=1 FlashInfer: " in capsys.readouterr().out


def test_decode_copy_column_dry_run(tmp_path, capsys):
    """The same-bytes copy column: it moves the B read states to the write slots (nothing else),
    its bandwidth counts the states only, and the table sets ours against it."""
    import torch
    bd = load_script("bench_decode")
    pool = torch.randn(9, 2, 3, 4)
    rs, ws = torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([4, 5, 6], dtype=torch.int32)
    before = pool.clone()
    bd.make_copy()(None, pool, rs, ws, None)()
    assert torch.equal(pool[4:7], before[1:4]) and torch.equal(pool[:4], before[:4])
    assert torch.equal(pool[7:], before[7:])
    res = bd.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-stack", "--no-sweep", "--tp", "1",
                   "--pools", "bf16", "--only", "ours,copy", "--batches", "2"])
    (row,) = [r for r in res["columns"] if r["column"] == "copy"]
    assert "error" not in row and row["total_bytes"] == row["state_bytes"], row
    assert abs(row["TBps"] - row["state_bytes"] / row["ms"] / 1e9) < 1e-12
    assert "ours/it" in capsys.readouterr().out


def test_decode_bf16_sweep_dry_run(tmp_path, capsys):
    """The bf16 sweep launches ours' kernel directly (so it can cap registers): its rows must
    agree with gdn_decode's default config."""
    bd = load_script("bench_decode")
    res = bd.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-stack", "--tp", "1",
                   "--pools", "bf16", "--only", "ours", "--batches", "4"])
    rows = res["bf16_sweep"]
    assert [(r["BV"], r["num_warps"], r["nsub"]) for r in rows] == [(8, 1, 1), (16, 2, 1), (4, 1, 2)]
    for r in rows:
        assert "error" not in r and r["rel_diff_out"] < 1e-6 and r["rel_diff_state"] < 1e-6, r
    assert "bf16 sweep B=4" in capsys.readouterr().out


def test_decode_flashinfer_b1_padded(tmp_path):
    """A FlashInfer that refuses B = 1 gets the batch padded with one row (slot 0): the row says
    so and still agrees with ours on the real row."""
    bd = load_script("bench_decode")

    def no_b1(**kw):
        if kw["q"].shape[0] == 1:
            raise TypeError("CuTe-DSL argument error (stand-in)")
        return fake_fi_decode(**kw)

    load_fi = lambda: (dict(fn=no_b1, version="stand-in"), None)  # noqa: E731
    load_fi.dry_run_ok = True
    bd.load_fi_decode = load_fi
    res = bd.main(["--out", str(tmp_path), "--cpu-dry-run", "--no-stack", "--no-sweep", "--tp", "1",
                   "--pools", "fp32", "--only", "fi", "--batches", "1"])
    (row,) = [r for r in res["columns"] if r["column"] == "fi"]
    assert "padded" in row["note"] and len(row["earlier_errors"]) == 2, row
    assert row["rel_diff_out"] < 2e-2 and row["rel_diff_state"] < 1e-5, row
