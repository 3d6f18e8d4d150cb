"""The ``gdn-graphs`` command: verify, a tiny demo (in a subprocess), and every argument it must
refuse (in-process through main(argv): exit status 2, one line on stderr naming the argument, no
traceback)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdn_graphs.engine import cli

ROOT = Path(__file__).resolve().parents[1]  # the checkout: `python -m` imports its package


def test_verify(capsys):
    assert cli.main(["verify", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] and len(res["rel_errors"]) == 8
    assert all(e < res["tolerance"] for e in res["rel_errors"].values())


def test_tiny_demo_json(tmp_path):
    # eager only (piecewise compiles for ~35 s), one paragraph: a 137-token prompt, 2 blocks. In a
    # subprocess, the command as users run it: in-process under pytest the same run takes 2.5x
    # longer (the interpreted kernels run deeper in the stack: see Engine.step)
    out = tmp_path / "demo.json"
    argv = ["demo", "--modes", "eager", "--prompt-repeats", "1", "--max-new-tokens", "2",
            "--block-size", "64", "--json-out", str(out), "--quiet"]
    proc = subprocess.run([sys.executable, "-m", "gdn_graphs.engine.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical across all configurations: yes" in proc.stdout
    res = json.loads(out.read_text())
    assert res["identical"] and res["prompt_tokens"] == 137 and res["modes"] == {"eager": "ok"}
    rows = res["rows"]
    assert len(rows) == 2 * (3 + 3)                   # caching on/off x (3 runs + 3 questions)
    assert len({tuple(r["tokens"]) for r in rows if r["scenario"] == "long prompt"}) == 1
    assert all(len(r["tokens"]) == 2 for r in rows)
    hits = {(r["caching"], r["scenario"], r["run"]): r["hit"] for r in rows}
    assert [hits["on", "long prompt", run] for run in ("warm-up", "1", "2")] == [0, 128, 128]
    assert [hits["on", "system prompt", q] for q in ("q0", "q1", "q2")] == [0, 128, 128]
    assert all(h == 0 for (caching, _, _), h in hits.items() if caching == "off")


def test_tiny_demo_spec_json(tmp_path):
    """--spec ngram: every configuration once more with speculation (k = 2); the tokens are the
    same as without it and the acceptance is reported (in a subprocess, as users run it)."""
    out = tmp_path / "demo.json"
    argv = ["demo", "--modes", "eager", "--prompt-repeats", "1", "--max-new-tokens", "3",
            "--block-size", "64", "--spec", "ngram", "--num-spec-tokens", "2",
            "--json-out", str(out), "--quiet"]
    proc = subprocess.run([sys.executable, "-m", "gdn_graphs.engine.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical across all configurations: yes" in proc.stdout
    assert "tokens accepted per spec row and step" in proc.stdout
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert len(rows) == 2 * 2 * (3 + 3) and {r["spec"] for r in rows} == {"off", "ngram k=2"}
    for key in {(r["scenario"], r["run"]) for r in rows}:
        toks = {tuple(r["tokens"]) for r in rows if (r["scenario"], r["run"]) == key}
        assert len(toks) == 1, key
    assert len({tuple(r["tokens"]) for r in rows if r["scenario"] == "long prompt"}) == 1
    hits = [r["hit"] for r in rows if r["spec"] != "off" and r["caching"] == "on"]
    assert hits == [0, 128, 128, 0, 128, 128]
    assert [(s["mode"], s["caching"], s["k"]) for s in res["spec"]] == [("eager", "on", 2),
                                                                         ("eager", "off", 2)]
    for s in res["spec"]:
        assert s["spec_rows"] > 0 and 1 <= s["tokens_per_row"] <= 3
        assert len(s["accepted_per_step"]) >= 1


BAD = [
    (["--block-size", "100"], "--block-size"),
    (["--block-size", "-64"], "--block-size"),
    (["--block-size", "0"], "--block-size"),
    (["--block-size", "x"], "--block-size"),
    (["--max-tokens", "100"], "--max-tokens"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-new-tokens", "-1"], "--max-new-tokens"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--max-new-tokens", "2.5"], "--max-new-tokens"),
    (["--prompt-repeats", "-3"], "--prompt-repeats"),
    (["--prompt-repeats", "0"], "--prompt-repeats"),
    (["--modes", "foo"], "--modes"),
    (["--modes", "eager,foo"], "--modes"),
    (["--modes", ","], "--modes"),
    (["--modes", "full"], "--modes"),                 # no CUDA GPU (forced below)
    (["--preset", "huge"], "--preset"),
    (["--dtype", "fp8"], "--dtype"),
    (["--json-out", "/nonexistent-folder/x.json"], "--json-out"),
    (["--spec", "eagle"], "--spec"),
    (["--spec", "ngram", "--num-spec-tokens", "0"], "--num-spec-tokens"),
    (["--spec", "ngram", "--num-spec-tokens", "64", "--block-size", "64"], "--num-spec-tokens"),
    (["--spec", "ngram", "--num-spec-tokens", "20", "--max-tokens", "64"], "--num-spec-tokens"),
]


@pytest.mark.parametrize("argv, name", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_argument_is_one_line(argv, name, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")       # as conftest sets it without a GPU
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", *argv])
    assert e.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"argument {name}" in err and "error" in err, err
    assert captured.out == ""


def test_defaults_only_for_arguments_not_given():
    args = argparse.Namespace(preset=None, prompt_repeats=None, block_size=None, max_tokens=None,
                              max_new_tokens=None, dtype=None)
    s = cli._demo_settings(args, has_gpu=False)
    assert (s["preset"], s["repeats"], s["block_size"], s["max_tokens"], s["max_new_tokens"],
            s["dtype"]) == ("tiny", 3, 64, 256, 6, torch.float32)
    args.block_size, args.max_tokens, args.max_new_tokens, args.dtype = 128, 512, 1, "bfloat16"
    s = cli._demo_settings(args, has_gpu=True)
    assert (s["preset"], s["block_size"], s["max_tokens"], s["max_new_tokens"],
            s["dtype"]) == ("qwen3-next", 128, 512, 1, torch.bfloat16)
