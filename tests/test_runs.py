"""Run directories, the Generator, the tokenizer and the `dantinox` command."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fast_compile import FAST_COMPILE
from flax import nnx

import dantinox
from dantinox.architectures import tokenizer
from dantinox.rundir import Generator, load_run, read_log, save_run
from dantinox.train import train
from dantinox_labs.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    """`dantinox ARGS` in this process (as the console script calls it): exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_console(*args):
    """`dantinox ARGS` as its own process, the way a learner's shell starts it."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()  # checked, not timed: as the worker compiles
    return subprocess.run([sys.executable, "-m", "dantinox_labs.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": flags}, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("the key and value of every past token are kept so they are never recomputed. " * 40)
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "r"
    train(out, preset="test", steps=30, corpus=corpus.read_text(), batch_size=8, seq_len=32, progress=False)
    return out


def test_tokenizer_round_trip_and_specials():
    text = "KV cache ≠ hardware cache"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode([72, tokenizer.MASK, 105], show_special=True) == "H<mask>i"
    assert tokenizer.VOCAB_SIZE == dantinox.ModelConfig().vocab_size


def test_training_lowers_the_loss_and_writes_a_run(run_dir):
    log = read_log(run_dir)
    assert log[0]["step"] == 1 and log[-1]["step"] == 30
    assert log[-1]["loss"] < log[0]["loss"] - 1.0
    assert {p.name for p in run_dir.iterdir()} == {"config.json", "weights.safetensors", "train_log.jsonl"}


def test_round_trip_restores_identical_weights(tmp_path):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(3))
    save_run(tmp_path, model)
    cfg2, model2 = load_run(tmp_path)
    assert cfg2 == cfg
    x = np.arange(10, dtype=np.int32)[None]
    np.testing.assert_array_equal(model(x)[0], model2(x)[0])


def test_generator_continues_text(run_dir):
    assert dantinox.Generator is Generator  # the public name the README uses
    gen = Generator(run_dir)
    out = gen.generate("the key", max_new_tokens=20)
    assert isinstance(out, str) and len(out.encode()) > 0
    assert out == gen.generate("the key", max_new_tokens=20, use_cache=False)


@pytest.mark.parametrize("damage, match", [
    (lambda d: (d / "weights.safetensors").unlink(), "weights.safetensors is missing"),
    (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "config.json").write_text(json.dumps({"n_layers": 2, "colour": 1})), "unknown field"),
    (lambda d: (d / "weights.safetensors").write_bytes(b"\x00" * 40), "unreadable safetensors"),
    (lambda d: (d / "weights.safetensors").write_bytes((d / "weights.safetensors").read_bytes()[:500]),
     "unreadable safetensors"),
])
def test_partial_or_corrupt_run_dir(tmp_path, damage, match):
    save_run(tmp_path, dantinox.Transformer(dantinox.ModelConfig.preset("test"), rngs=nnx.Rngs(0)))
    damage(tmp_path)
    with pytest.raises(ValueError, match=match):
        Generator(tmp_path)


def test_weights_that_do_not_match_the_config(tmp_path):
    save_run(tmp_path, dantinox.Transformer(dantinox.ModelConfig.preset("test"), rngs=nnx.Rngs(0)))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_model"] = 48
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="has shape"):
        load_run(tmp_path)


def test_missing_run_dir():
    with pytest.raises(ValueError, match="not a directory"):
        Generator("/nonexistent/run")


def test_cli_generate_prints_text_and_rate(run_dir):
    res = run_console("generate", "--run_dir", str(run_dir), "--prompt", "the key", "--max_new_tokens", "8")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("the key")
    assert "tokens/s" in res.stderr
    res = run_cli("generate", "--run_dir", str(run_dir), "--prompt", "the key", "--max_new_tokens", "8", "--no_cache")
    assert res.returncode == 0 and "no cache" in res.stderr


def test_cli_refuses_diffusion_options_on_an_autoregressive_run(run_dir):
    for flag, value in (("--cache", "dual"), ("--block_size", "8"), ("--threshold", "0.5")):
        res = run_cli("generate", "--run_dir", str(run_dir), "--prompt", "x", "--max_new_tokens", "8", flag, value)
        assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
        assert res.stderr.strip().splitlines() == [
            f"dantinox generate: error: {flag} applies to diffusion runs; {run_dir} holds a model with "
            "paradigm='autoregressive'"]


def test_the_cli_trains_on_the_text_of_the_concept_entries():
    import content

    text = content.corpus_text()
    assert "KV cache" in text and len(text) > 10_000


@pytest.mark.parametrize("steps", ["1", "3"])  # one step once crashed inside the learning-rate schedule
def test_cli_train_smoke(tmp_path, corpus, steps):
    res = run_cli("train", "--run_dir", str(tmp_path / "r"), "--preset", "test", "--steps", steps, "--corpus",
                  str(corpus), "--seq_len", "16", "--batch_size", "2")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r" / "weights.safetensors").is_file()


@pytest.mark.parametrize("args, match", [
    (("generate", "--run_dir", "/nonexistent", "--prompt", "x"), "not a directory"),
    (("train", "--run_dir", "/tmp/x", "--preset", "huge"), "preset: expected one of"),
    (("train", "--run_dir", "/tmp/x", "--corpus", "/nonexistent.txt"), "corpus: /nonexistent.txt is not a file"),
    (("train", "--run_dir", "/tmp/x", "--steps", "0"), "steps: expected a positive integer"),
])
def test_cli_errors_are_one_line(args, match):
    res = run_cli(*args)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and match in res.stderr


def test_cli_tables_match_readme():
    res = run_cli("tables")
    assert res.returncode == 0
    assert "| MHA | 8 | 6 MiB |" in res.stdout
    readme = (ROOT / "README.md").read_text()
    assert res.stdout.strip() in readme, "README's reference tables are stale: paste `dantinox tables` output"


@pytest.fixture(scope="module")
def diffusion_run_dir(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "d"
    train(out, preset="test", steps=20, paradigm="diffusion", corpus=corpus.read_text(), batch_size=8, seq_len=32,
          progress=False)
    return out


def test_diffusion_run_generates_through_generator_and_cli(diffusion_run_dir):
    gen = Generator(diffusion_run_dir)
    assert gen.cfg.paradigm == "diffusion"
    text = gen.generate("the key", max_new_tokens=16, block_size=8)
    assert gen.last_nfe is not None and 2 <= gen.last_nfe <= 16  # at least one step per block, at most one per token
    assert isinstance(text, str)
    res = run_cli("generate", "--run_dir", str(diffusion_run_dir), "--prompt", "the key", "--max_new_tokens", "16",
                  "--block_size", "8", "--cache", "prefix")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("the key") and "cache=prefix" in res.stderr and "model evaluations" in res.stderr


def test_diffusion_cli_refuses_partial_blocks(diffusion_run_dir):
    res = run_cli("generate", "--run_dir", str(diffusion_run_dir), "--prompt", "x", "--max_new_tokens", "10",
                  "--block_size", "8")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "block_size" in res.stderr
