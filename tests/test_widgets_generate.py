"""The generate panel: real cached and uncached decoding on the tiny "test" preset."""

import contextlib
import logging
import re

import jax
import pytest
from flax import nnx

import content
import dantinox
from dantinox.rundir import save_run
from widgets import CacheLab, GeneratePanel


@contextlib.contextmanager
def compilations():
    """Names of the programs JAX compiles inside the block (any thread), from its compile log."""
    names = []

    class Collect(logging.Handler):
        def emit(self, record):
            match = re.match(r"Compiling (\S+)", record.getMessage())
            if match:
                names.append(match.group(1))

    handler, logger = Collect(), logging.getLogger("jax")
    logger.addHandler(handler)
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)  # global, not a context: decoding runs in another thread
    try:
        yield names
    finally:
        jax.config.update("jax_log_compiles", previous)
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def lab():
    return CacheLab(content.load_entry("kv-cache"), preset="test", attention="gqa", cache_dtype="float32")


def test_cached_decoding_streams_tokens_and_the_filling_cache(lab, tmp_path):
    panel = GeneratePanel(lab, run_dir=tmp_path / "absent", prompt="abc", new_tokens=6)
    panel.run(use_cache=True, wait=True)
    assert panel.error == ""
    run = panel.runs["cache"]
    assert len(run.tokens) == 6 and run.held == [4, 5, 6, 7, 8, 9]
    cfg = lab.reading.cfg
    assert run.filled_bytes == [dantinox.kv_cache_bytes(cfg, 1, t) for t in run.held]  # measured == formula
    assert run.allocated_bytes == dantinox.kv_cache_bytes(cfg, 1, cfg.max_context)
    assert run.tokens_per_s > 0
    assert "untrained weights" in panel.status.value
    names = [t.name for t in panel.figure.data]
    assert "bytes held for filled tokens (measured)" in names and "formula for those tokens (derived)" in names
    assert "tokens/s" in panel.stats.value and not panel.cached_button.disabled


def test_uncached_decoding_gives_the_same_tokens_without_recompiling_on_reclick(lab, tmp_path):
    panel = GeneratePanel(lab, run_dir=tmp_path / "absent", prompt="abc", new_tokens=5)
    panel.run(use_cache=True, wait=True)
    panel.run(use_cache=False, wait=True)
    assert panel.error == ""
    assert panel.runs["no cache"].tokens == panel.runs["cache"].tokens  # greedy: same text either way
    assert panel.runs["no cache"].filled_bytes == []
    assert "as long over the same" in panel.stats.value
    model = panel.model_for(lab.reading.cfg)[0]
    panel.new_tokens.value = 7  # a different T, a second click: the compiled step is reused
    with compilations() as compiled:
        panel.run(use_cache=True, wait=True)
        panel.run(use_cache=False, wait=True)
    assert panel.error == "" and len(panel.runs["cache"].tokens) == 7
    assert compiled == []
    assert panel.model_for(lab.reading.cfg)[0] is model


def test_trained_weights_are_used_when_the_run_matches(lab, tmp_path):
    trained = dantinox.Transformer(lab.reading.cfg.replace(cache_dtype="bfloat16"), rngs=nnx.Rngs(7))
    save_run(tmp_path / "tiny", trained)
    panel = GeneratePanel(lab, run_dir=tmp_path / "tiny", prompt="ab", new_tokens=2)
    panel.run(use_cache=True, wait=True)
    assert panel.error == "" and "trained weights from tiny" in panel.status.value
    model, _ = panel.model_for(lab.reading.cfg)
    assert (model.embed.embedding[...] == trained.embed.embedding[...]).all()
    other = lab.reading.cfg.replace(attention="mha")
    _, where = panel.model_for(other)
    assert where.startswith("untrained weights") and "holds a 2-layer GQA K=2 model, not this one" in where


def test_refusals_are_shown_not_raised(lab, tmp_path):
    panel = GeneratePanel(lab, run_dir=tmp_path / "absent", prompt="abc", new_tokens=62)
    panel.run(use_cache=True, wait=True)
    assert "= 65 exceeds max_context=64" in panel.error and "exceeds max_context" in panel.status.value
    with pytest.raises(ValueError, match=r"new_tokens: expected an integer in \[1, 63\]"):
        GeneratePanel(lab, new_tokens=64)
    small = GeneratePanel(lab, run_dir=tmp_path / "absent", prompt="abc", new_tokens=2, budget_bytes=100)
    small.run(use_cache=True, wait=True)
    assert small.error.startswith("concurrency B: the static KV cache for B=1 needs")
    assert not small.cached_button.disabled
