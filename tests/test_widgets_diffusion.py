"""The diffusion lab, driven headless: all three cache modes per setting, runs and error as traits."""

import asyncio
import concurrent.futures
import re
import threading

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.generation import diffusion
from widgets import DiffusionLab
from widgets.diffusion_lab import SETTLE_S, run_modes


@pytest.fixture(scope="module")
def model():
    """Random weights suffice: every assertion holds whatever the model predicts."""
    cfg = dantinox.ModelConfig.preset("test", paradigm="diffusion")
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def lab(model):
    return DiffusionLab(model, prompt="the cat ", gen_lengths=(16, 32), block_sizes=(4, 8), gen_length=16,
                        block_size=8, threshold=0.9)


def test_the_lab_runs_every_mode_and_follows_the_controls(lab, monkeypatch):
    assert set(lab.runs) == set(diffusion.CACHE_MODES) and lab.error == "" and lab.message.value == ""
    assert all(f"<b>{c}</b>" in lab.table.value for c in diffusion.CACHE_MODES)
    seen, during = [], {}
    lab.observe(lambda change: seen.append(change["new"]), names="runs")
    real = run_modes

    def watched(*args):
        during.update(message=lab.message.value, disabled=[c.disabled for c in (lab.block_size, lab.gen_length,
                                                                                lab.threshold, lab.play)],
                      table=lab.table.value)
        return real(*args)

    monkeypatch.setattr("widgets.diffusion_lab.run_modes", watched)
    runs = lab.update(threshold=1.0, gen_length=32, block_size=4)  # a new shape: it compiles first
    assert len(seen) == 1 and seen[0] is runs is lab.runs  # one run of the three modes for three controls
    assert during["disabled"] == [True] * 4 and not any(c.disabled for c in (lab.block_size, lab.threshold))
    assert "compiling 3 program(s) (none, prefix, dual)" in during["message"]
    assert "previous settings" in during["table"] and "previous settings" not in lab.table.value  # marked, then new
    assert re.search(r"about \d+ s \(measured", during["message"])  # from the compile the lab timed at start
    dual = runs["dual"].result
    assert dual.nfe == 32 and lab.step.max == lab.play.max == 32
    assert [len(t.y) for t in lab.figure.data] == [32] * 5
    np.testing.assert_array_equal(lab.figure.data[2].y * 1024, dual.cache_bytes)
    assert runs["none"].agreement == 1.0  # each mode is compared with "none"


def test_the_step_view_follows_the_step_slider(lab):
    lab.update(threshold=1.0, gen_length=32, block_size=4)
    lab.show.value = "dual"
    lab.step.value = 5  # the play button moves this slider; block 2 starts at step 5 (4 steps per block)
    assert "step 5 of 32</b>, block 2 of 8 (full forward, refreshes the cache): 40 positions" in lab.caption.value
    lab.step.value = 6
    assert "(cached step): 4 positions" in lab.caption.value
    assert lab.sequence.value.count("font-weight:bold") == 1  # one token decoded per step at threshold 1
    lab.show.value = "none"
    assert "full forward" in lab.caption.value and "border-bottom:3px" not in lab.sequence.value.split("<div")[1]


def test_quiz_params_use_the_content_alphabet(lab, model):
    lab.update(threshold=1.0, gen_length=32, block_size=4)
    params = lab.formula_params()
    assert (params["T"], params["W"], params["s"]) == (8 + 32, 4, 4)
    assert params["H_kv"] == model.cfg.n_kv_heads and params["d_h"] == model.cfg.head_size


def test_run_modes_is_the_lab_without_a_widget(lab, model):
    runs = run_modes(model, lab.prompt_ids, 16, 8, 1.0)
    assert set(runs) == set(diffusion.CACHE_MODES) and runs["none"].agreement == 1.0
    assert all(r.result.nfe == 16 and r.seconds > 0 for r in runs.values())  # threshold 1: one token per step


def test_bad_settings_raise_and_failures_show_in_the_lab(lab, monkeypatch):
    with pytest.raises(ValueError, match="^update: unknown control"):
        lab.update(blocks=3)
    with pytest.raises(ValueError, match=r"^block_size: expected an integer in \[4, 8\], got 3$"):
        lab.update(block_size=3)
    with pytest.raises(ValueError, match=r"^block_size: expected a divisor of the gen length \(\d+\), got 5$"):
        lab.update(block_size=5)
    with pytest.raises(ValueError, match="^gen_lengths: each must be a multiple"):
        DiffusionLab(lab.model, prompt="the cat ", gen_lengths=(20,), block_sizes=(8,), gen_length=20, block_size=8)

    def broken(*_):
        raise RuntimeError("decoder exploded")

    monkeypatch.setattr("widgets.diffusion_lab.run_modes", broken)
    lab.threshold.value = 0.5
    assert lab.error == "RuntimeError: decoder exploded" and "decoder exploded" in lab.message.value
    monkeypatch.undo()
    lab.threshold.value = 0.6
    assert lab.error == "" and lab.runs["dual"].result.threshold == pytest.approx(0.6)


def test_settings_decoded_before_are_reused_and_compiled_shapes_run_once(lab, monkeypatch):
    lab.update(threshold=0.8, gen_length=16, block_size=8)  # the fixture's shape: compiled at construction
    calls = []
    real = diffusion.diffusion_generate
    monkeypatch.setattr("widgets.diffusion_lab.diffusion_generate", lambda *a: calls.append(a) or real(*a))
    first = lab.update(threshold=0.7)
    assert len(calls) == 3 and not lab.reused  # one call per mode: no second, compiling call
    lab.update(threshold=0.75)
    calls.clear()
    again = lab.update(threshold=0.7)
    assert calls == [] and again is first and lab.reused and "decoded earlier" in lab.message.value


def test_browser_moves_run_once_at_the_value_they_settle_on(lab, monkeypatch):
    lab.update(threshold=0.9, gen_length=16, block_size=8)
    ran = []
    real = run_modes
    monkeypatch.setattr("widgets.diffusion_lab.run_modes", lambda m, p, g, b, t, *rest: ran.append(t) or
                        real(m, p, g, b, t, *rest))

    async def three_arrow_presses():
        for value in (0.45, 0.4, 0.35):
            stops = [v for _, v in lab.threshold.slider.options]
            lab.threshold.slider.set_state({"index": stops.index(value)})  # what a message from the front end does
        assert ran == [] and "threshold 0.35" in lab.message.value
        await asyncio.sleep(SETTLE_S + 0.3)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # an event loop of its own, as a kernel has one
        pool.submit(asyncio.run, three_arrow_presses()).result()
    lab.wait()  # a run the browser starts works in a thread (the kernel still hears its stop button)
    assert ran == [0.35] and lab.runs["dual"].result.threshold == pytest.approx(0.35)


def test_stop_ends_a_browser_run_before_its_next_compile_and_puts_the_settings_back(lab, monkeypatch):
    shown = lab.update(threshold=0.9, gen_length=16, block_size=8)
    table = lab.table.value
    calls = []
    real = diffusion.diffusion_generate

    def pressed_during_the_first(*args):
        calls.append(args[5])
        assert not lab.stop_button.disabled and lab.block_size.disabled  # stop is offered, the rest held
        lab.stop_button.click()  # as the learner does while the first mode compiles or decodes
        return real(*args)

    monkeypatch.setattr("widgets.diffusion_lab.diffusion_generate", pressed_during_the_first)
    with lab.batched():  # what the browser's moves leave before the slider settles
        lab.gen_length.value, lab.block_size.value, lab.threshold.value = 32, 8, 0.65
    lab._settled()
    lab.wait()
    assert calls == ["none"]  # the call under way finished; nothing after it began
    assert "Stopped before decoding gen length 32, block 8, threshold 0.65" in lab.message.value
    assert (lab.gen_length.value, lab.block_size.value, lab.threshold.value) == (16, 8, 0.9)
    assert lab.runs is shown and lab.table.value == table and lab.error == ""  # the runs on screen, unmarked
    assert lab.stop_button.disabled and not any(c.disabled for c in (lab.block_size, lab.gen_length, lab.play))


def test_a_move_that_races_a_browser_run_stops_it_and_runs_next(lab, monkeypatch):
    """A move sent before the controls were disabled reaches the kernel while a run works: that run stops, the
    controls keep the move, and the move's value runs once the stopped run has ended."""
    lab.update(threshold=0.9, gen_length=16, block_size=8)
    real, started, release = diffusion.diffusion_generate, threading.Event(), threading.Event()

    def held(*args):
        started.set()
        release.wait(30)  # the run is under way while the second move arrives
        return real(*args)

    monkeypatch.setattr("widgets.diffusion_lab.diffusion_generate", held)
    stops = [v for _, v in lab.threshold.slider.options]

    async def two_moves():
        lab.threshold.slider.set_state({"index": stops.index(0.45)})  # what a message from the front end does
        await asyncio.sleep(SETTLE_S + 0.2)
        assert await asyncio.to_thread(started.wait, 30)
        lab.threshold.slider.set_state({"index": stops.index(0.5)})
        await asyncio.sleep(SETTLE_S + 0.3)  # the second move has settled while the first run still works
        release.set()
        while lab._running() or lab._pending is not None:
            await asyncio.sleep(0.1)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # an event loop of its own, as a kernel has one
        pool.submit(asyncio.run, two_moves()).result()
    assert lab.threshold.value == 0.5 and lab.runs["dual"].result.threshold == pytest.approx(0.5)
    assert "Stopped" not in lab.message.value and "previous settings" not in lab.table.value


def test_typed_sizes_are_taken_or_refused_in_one_line(lab):
    lab.update(threshold=0.9, gen_length=16, block_size=8)
    assert not lab.block_size.type("5") and "divisor of the gen length (16), got 5; kept 8" in lab.block_size.message
    assert not lab.gen_length.type("20") and "multiple of the block size (8)" in lab.gen_length.message
    assert lab.runs["dual"].result.block_size == 8 and lab.runs["dual"].result.gen_length == 16
    assert lab.threshold.type("0.83") and lab.runs["dual"].result.threshold == pytest.approx(0.83)  # off the grid
    assert not lab.threshold.type("0,83") and "decimal point" in lab.threshold.message
