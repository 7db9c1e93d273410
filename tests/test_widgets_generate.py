"""The generate panel: real chunked decoding on the tiny "test" preset, and the trained runs it picks."""

import contextlib
import dataclasses
import logging
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import content
import dantinox
from dantinox.architectures import pretrained, tokenizer
from dantinox.rundir import save_run
from widgets import CacheLab, GeneratePanel
from widgets.decode_models import PUBLISHED, find_run, same_model
from widgets.decode_runs import DecodeRun, DecodeSettings, progress_text, seconds_left, step_ratio
from widgets.generate import CHAT_PROMPT, MAX_REDRAWS_PER_S

RUNS = Path(__file__).resolve().parents[1] / "runs"
SHIPPED = {"tiny": dict(), "tiny-gqa": dict(kv_heads=2),
           "tiny-mqa": dict(kv_heads=1), "tiny-mla": dict(attention="latent", kv_latent_dim=64, rope_head_dim=16)}


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
def entry():
    return content.load_entry("kv-cache")


@pytest.fixture(scope="module")
def lab(entry):
    return CacheLab(entry, preset="test", attention="gqa", cache_dtype="float32")


def test_cached_decoding_streams_chunks_and_the_filling_cache(lab, tmp_path):
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=20)
    draws = []
    panel._draw = lambda cfg, draw=panel._draw: (draws.append(1), draw(cfg))  # count redraws
    panel.run(use_cache=True, wait=True)
    assert panel.error == ""
    run, cfg = panel.runs["cache"], lab.reading.cfg
    assert len(run.tokens) == 20 and run.held == [11, 19, 23] and run.steps == [8, 8, 4]
    assert run.filled_bytes == [dantinox.kv_cache_bytes(cfg, 1, t) for t in run.held]  # measured == formula
    per_slot = dantinox.kv_cache_bytes(cfg, 1, 1)
    assert all(a % per_slot == 0 and a // per_slot >= t for a, t in zip(run.allocated_bytes, run.held, strict=True))
    assert run.tokens_per_s > 0 and run.wall_tokens_per_s > 0
    assert len(draws) <= 2 + run.wall_seconds * MAX_REDRAWS_PER_S  # throttled, not one redraw per chunk
    assert "untrained weights" in panel.status.value and "no runs in" in panel.status.value
    names = [t.name for t in panel.figure.data]
    assert "bytes held for filled tokens (measured)" in names and "formula for those tokens (derived)" in names
    timing = next(t for t in panel.figure.data if t.name == "cache, B=1: ms per decode step (measured)")
    assert len(timing.y) == len(run.steady())
    assert "model time" in panel.stats.value and "on screen" in panel.stats.value
    assert not panel.cached_button.disabled


def test_chunks_that_compiled_are_left_out_of_rates_and_curves():
    run = DecodeRun(use_cache=True, batch=2, prompt_tokens=3, held=[11, 19, 27], steps=[8, 8, 8],
                    seconds=[4.0, 0.008, 0.016], compiled=[True, False, False])
    assert run.steady() == [1, 2]
    assert run.ms_per_token() == pytest.approx([1.0, 2.0])  # the 4 s compile never sets the scale
    assert run.tokens_per_s == pytest.approx(2 * 16 / 0.024)


def test_uncached_decoding_gives_the_same_tokens_without_recompiling_on_reclick(lab, tmp_path):
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=20)
    panel.run(use_cache=True, wait=True)
    panel.run(use_cache=False, wait=True)
    assert panel.error == ""
    assert panel.runs["no cache"].tokens == panel.runs["cache"].tokens  # greedy: same text either way
    assert panel.runs["no cache"].filled_bytes == []
    shown = (r"at (\d+) tokens held, one decode step \(one token for each of the B=1 sequences\) takes [\d.]+ ms "
             r"without the cache and [\d.]+ ms with it: [\d.]+× as long")
    found = re.search(shown, panel.stats.value)
    assert found and "one run of each" in panel.stats.value, panel.stats.value
    held = int(found.group(1))  # a length both runs timed after compiling (which chunks compiled may vary)
    for run in panel.runs.values():
        assert held in [run.held[i] for i in run.steady()]
    assert panel.ratio() is not None and len(panel.ratio().cache_ms) == 1
    model = panel.model_for(lab.reading.cfg)[0]
    panel.new_tokens.value = 16  # a different T, a second click: the compiled chunk is reused
    with compilations() as compiled:
        panel.run(use_cache=True, wait=True)
        panel.run(use_cache=False, wait=True)
    assert panel.error == "" and len(panel.runs["cache"].tokens) == 16
    assert compiled == [] and not any(panel.runs["cache"].compiled + panel.runs["no cache"].compiled)
    assert panel.model_for(lab.reading.cfg)[0] is model


def test_trained_weights_are_used_when_a_run_matches(lab, tmp_path):
    trained = dantinox.Transformer(lab.reading.cfg.replace(cache_dtype="bfloat16"), rngs=nnx.Rngs(7))
    save_run(tmp_path / "mine", trained)
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="ab", new_tokens=2)
    panel.run(use_cache=True, wait=True)
    assert panel.error == "" and f"trained weights from {tmp_path / 'mine'}" in panel.status.value
    model, _ = panel.model_for(lab.reading.cfg)
    assert (model.embed.embedding[...] == trained.embed.embedding[...]).all()
    _, where = panel.model_for(lab.reading.cfg.replace(kv_heads=None))
    assert where.startswith("untrained weights") and "(runs: mine: 2-layer d=32 GQA K=2)" in where
    run = panel.runs["cache"]
    only_compiled = dataclasses.replace(run, tokens=run.tokens[:1], held=run.held[:1], steps=[1],
                                        seconds=run.seconds[:1], compiled=[True])
    panel.runs["cache"] = dataclasses.replace(only_compiled, finished=False)
    panel._show(panel.runs["cache"], lab.reading.cfg)  # while it decodes
    assert "timing the first compiled step" in panel.stats.value
    panel.runs["cache"] = only_compiled
    panel._show(only_compiled, lab.reading.cfg)  # after: no rate is made up from a compiling chunk
    assert "no step timed: every chunk of this run compiled" in panel.stats.value


def test_refusals_are_shown_not_raised(lab, tmp_path):
    with pytest.raises(ValueError, match=r"new_tokens: expected an integer in \[1, 61\] \(the 64-token context "
                                         r"of this preset less the 3-token prompt\), got 62"):
        GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=62)
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=61)
    assert panel.new_tokens.max == 61  # every slider position fits after the prompt
    panel.prompt.value = "abcdef"  # a longer prompt: the slider's end follows it
    assert panel.new_tokens.max == panel.new_tokens.value == 58
    panel.run(use_cache=True, wait=True)
    assert panel.error == "" and len(panel.runs["cache"].tokens) == 58
    panel.prompt.value = "x" * 64  # no room left: said at once, and a click refuses it
    assert "leave no room to decode" in panel.status.value
    panel.run(use_cache=True, wait=True)
    assert "exceeds max_context=64" in panel.error and "exceeds max_context" in panel.status.value
    with pytest.raises(ValueError, match=r"preset: expected None \(the lab's\) or one of"):
        GeneratePanel(lab, preset="huge")
    small = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=2, budget_bytes=100)
    small.run(use_cache=True, wait=True)
    assert small.error.startswith("concurrency B: the KV cache for B=1 needs")
    assert not small.cached_button.disabled


def _timed(use_cache, settings, ms):
    """A finished run whose steady chunks (8 steps each, after one that compiled) took `ms` per step."""
    held = [11 + 8 * i for i in range(len(ms) + 1)]
    return DecodeRun(use_cache=use_cache, batch=settings.batch, prompt_tokens=settings.prompt_tokens, held=held,
                     steps=[8] * len(held), seconds=[9.0, *(m * 8e-3 for m in ms)],
                     compiled=[True] + [False] * len(ms), settings=settings)


def test_the_ratio_compares_only_runs_with_identical_settings_and_shows_its_spread(lab):
    one = DecodeSettings(lab.reading.cfg, batch=1, prompt_tokens=3, new_tokens=20)
    other = dataclasses.replace(one, batch=2)
    runs = [_timed(True, one, [1.0, 2.0]), _timed(False, other, [30.0, 40.0])]
    assert step_ratio(runs, one) is None and step_ratio(runs, other) is None  # B=1 with, B=2 without: no pair
    runs += [_timed(False, one, [10.0, 20.0]), _timed(False, one, [15.0, 30.0]), _timed(True, one, [1.0, 4.0])]
    r = step_ratio(runs, one)
    assert r.held == 27 and r.cache_ms == (2.0, 4.0) and r.no_cache_ms == (20.0, 30.0)  # the B=2 run left out
    assert r.ratio == pytest.approx(25.0 / 3.0) and r.spread == pytest.approx((5.0, 15.0))
    assert one.differences(other) == ["B=1 vs B=2"]


def test_progress_estimates_the_time_left_from_the_chunks_so_far(lab):
    settings = DecodeSettings(lab.reading.cfg, batch=1, prompt_tokens=3, new_tokens=40)
    cached = _timed(True, settings, [1.0, 1.0])  # 8 ms per 8-step chunk after a compile: 1 ms a step
    cached.tokens = [0] * 24
    assert seconds_left(cached, 40) == pytest.approx(16 * 1e-3)
    uncached = _timed(False, settings, [1.9, 2.7])  # per step ∝ tokens held: 19 and 27 held
    uncached.tokens = [0] * 24
    assert seconds_left(uncached, 40) == pytest.approx(0.1e-3 * sum(range(28, 44)))
    assert "compiling the decode step first" in progress_text(DecodeRun(True, 1, 3), 40)
    assert "about 0 s left" in progress_text(cached, 40) and "24 of 40 tokens" in progress_text(cached, 40)


def test_runs_at_different_batches_show_no_ratio(lab, tmp_path):
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=12)
    panel.run(use_cache=True, wait=True)
    lab.update(batch=2)
    try:
        panel.run(use_cache=False, wait=True)
    finally:
        lab.update(batch=1)
    assert panel.error == "" and panel.ratio() is None
    assert "No ratio: the last run with the cache and the last without differ (B=1 vs B=2)" in panel.stats.value
    assert "as long" not in panel.stats.value


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_run_is_trained_and_is_found_for_its_model(name):
    cfg, model = dantinox.load_run(RUNS / name)
    assert same_model(cfg, dantinox.ModelConfig.preset("tiny", **SHIPPED[name]))
    assert find_run(cfg)[0] == RUNS / name
    prompt = tokenizer.encode("The KV cache stores")
    out = np.asarray(dantinox.generate(model, np.asarray([prompt], np.int32), 32))[0, len(prompt):]
    text = tokenizer.decode(out.tolist())
    assert len(set(text)) >= 6, f"{name}: greedy text {text!r} looks untrained"  # random weights repeat a byte


@pytest.mark.parametrize("attention,kv_heads,run", [("mha", None, "tiny"), ("gqa", 2, "tiny-gqa"),
                                                    ("mqa", None, "tiny-mqa")])
def test_the_panel_picks_the_run_matching_the_lab(entry, attention, kv_heads, run):
    lab = CacheLab(entry, preset="test", attention=attention, kv_heads=kv_heads, cache_dtype="bfloat16")
    panel = GeneratePanel(lab, preset="tiny")  # the lab's variant on the preset the shipped runs use
    assert panel.model_for(panel.config())[1] == f"trained weights from runs/{run}"
    _, where = GeneratePanel(lab, preset=None).model_for(lab.config())  # the lab's "test": no run for it
    assert where.startswith("untrained weights (random init): no run matches this 2-layer d=32")


def test_the_panel_decodes_smollm2_by_default_and_measures_its_cache(entry):
    lab = CacheLab(entry, cache_dtype="bfloat16")
    panel = GeneratePanel(lab, new_tokens=16)
    assert panel.preset.value == PUBLISHED and panel.prompt.value == CHAT_PROMPT
    cfg = panel.config()
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.head_size, cfg.cache_dtype) == (30, 3, 64, "bfloat16")
    panel.run(use_cache=True, wait=True)
    assert not panel.error, panel.error
    run = panel.runs["cache"]
    assert run.bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040  # K and V, L, K, H, two bytes of bfloat16
    assert "cache per token</b>: 23,040 B" in panel.stats.value and "= 23,040 B" in panel.stats.value
    answer = panel.decode(cfg, run.tokens)
    assert "cache" in answer.lower() and "<|im" not in answer, answer  # its own answer, about caches
    assert "published weights" in panel.status.value


def test_without_the_model_wheel_the_panel_decodes_the_tiny_runs_and_says_so(entry, monkeypatch):
    monkeypatch.setattr(pretrained, "available", lambda name=PUBLISHED: False)
    panel = GeneratePanel(CacheLab(entry, preset="test"))
    assert panel.preset.value == "tiny" and panel.prompt.value == "The KV cache"
    assert "not installed" in panel.status.value and "tiny trained runs" in panel.status.value
    assert PUBLISHED not in [value for _, value in panel.preset.options]


def test_the_sizes_lab_has_a_smollm2_preset_whose_other_k_are_converted_models(entry):
    lab = CacheLab(entry, preset=PUBLISHED, attention="gqa", cache_dtype="bfloat16", tokens=16)
    assert ("SmolLM2-135M", PUBLISHED) in lab.preset.options and lab.kv_heads.value == 3
    assert lab.reading.per_token_bytes == 23_040 and lab.reading.residual == 0
    assert "What-if" not in lab.status_html.value
    for variant in ("mha", "mqa"):  # tests/test_convert.py: these configs are convert_attention's
        lab.attention.value = variant
        note = lab.status_html.value
        assert "Converted, not retrained: SmolLM2-135M has GQA with K=3" in note and "nobody trained" not in note
        assert f"convert_attention(model, to=&#x27;{variant}&#x27;)" in note or f"to='{variant}'" in note
    assert "(exact)" in CacheLab(entry, preset=PUBLISHED, attention="mha").status_html.value


def test_bytes_that_are_not_utf8_on_their_own_read_as_escapes():
    assert tokenizer.decode([0xE2, 0x41]) == "\ufffdA"  # the library default
    assert tokenizer.decode([0xE2, 0x41], errors="backslashreplace") == "\\xe2A"  # what the panel shows
    assert tokenizer.decode(list("é".encode())) == "é"  # a whole character is unchanged


def test_the_already_running_note_goes_when_the_run_ends(lab, tmp_path, monkeypatch):
    import threading

    gate, real = threading.Event(), dantinox.stream

    def held(*args, **kwargs):  # the decode waits until the test has clicked a second time
        gate.wait(60)
        yield from real(*args, **kwargs)

    monkeypatch.setattr(dantinox, "stream", held)
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=8)
    panel.run(use_cache=True)
    panel.run(use_cache=False)  # a click while it runs
    assert "already running" in panel.status.value
    gate.set()
    panel.wait()
    assert panel.error == "" and "already running" not in panel.status.value  # it stayed after the run
    assert "untrained weights" in panel.status.value  # the line it covered is back


def test_new_tokens_are_typed_exactly_and_the_cache_axis_takes_the_fitting_unit(lab, tmp_path):
    panel = GeneratePanel(lab, preset=None, runs_dir=tmp_path, prompt="abc", new_tokens=20)
    assert panel.new_tokens.type("13") and panel.new_tokens.value == 13
    assert not panel.new_tokens.type("62") and "from 1 to 61 tokens" in panel.new_tokens.message
    panel.run(use_cache=True, wait=True)
    assert panel.error == "" and len(panel.runs["cache"].tokens) == 13
    assert panel.figure.layout.yaxis.title.text == "KiB"  # a few KiB of cache: not 0.01 MiB
