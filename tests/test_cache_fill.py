"""A published model's cache filling step by step (widgets/cache_fill.py): each layer's slots held and read follow
its kind's rule, agree with what the decode wrote into the arrays, and its bytes equal the ledger's at every step.

Tiny architectures (narrow, few layers) keep the compile to a second or two; the catalogue models' geometry is
checked by tests/test_working_model.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dantinox.architectures.catalogue import Architecture, LayerGeometry, load_architecture
from widgets.cache_fill import decode_fill, disagreements, fill_plan, kind_summary

W = C = 4  # the tiny model's window and chunk: a 10-token decode wraps the ring twice and starts a third chunk
TINY = Architecture(
    name="tiny hybrid", model_type="test", d_model=16, n_heads=2, config_kv_heads=2, max_context=64,
    source="tests/test_cache_fill.py", layers=(
        LayerGeometry(0, "full", kv_heads=2, head_size=8),
        LayerGeometry(1, "sliding", kv_heads=2, head_size=8, window=W),
        LayerGeometry(2, "chunked", kv_heads=1, head_size=8, window=C),
        LayerGeometry(3, "shared", kv_heads=2, head_size=8, shares=1),
        LayerGeometry(4, "linear", kv_heads=1, head_size=8, value_heads=2, value_size=8, conv=4)))
UNEQUAL = Architecture(
    name="unequal heads", model_type="test", d_model=16, n_heads=2, config_kv_heads=2, max_context=64,
    source="tests/test_cache_fill.py", layers=(
        LayerGeometry(0, "linear", kv_heads=1, head_size=8, value_heads=2, value_size=16, conv=4),))
LATENT = Architecture(
    name="tiny latent", model_type="test", d_model=16, n_heads=2, config_kv_heads=2, max_context=64,
    source="tests/test_cache_fill.py", layers=tuple(LayerGeometry(i, "latent", latent=16, rope=8) for i in range(2)))


def _written_slots(payload) -> np.ndarray:
    """Slots of a K/V layer whose keys are not all zero: what the decode wrote, read from the data."""
    return np.flatnonzero(np.any(np.asarray(payload.k, np.float32) != 0, axis=(0, 1, 2)))


def test_each_layer_kind_fills_by_its_rule_and_equals_the_ledger_at_every_step():
    plan = fill_plan(TINY, tokens=10)
    steps, previous = [], None
    for step, cache in decode_fill(plan):
        n = step.tokens
        steps.append(step)
        assert step.held == (n, min(n, W), min(n, C), 0, 0)
        assert step.read == (n, min(n, W), (n - 1) % C + 1, min(n, W), 0)  # a chunk reads its own; shared its source's
        assert step.bytes[3] == 0 and step.bytes[4] == plan.constant[4] > 0  # shared: nothing; state: flat
        assert step.read_bytes[3] == step.read_bytes[1] and step.read_bytes[4] == plan.constant[4]
        layers = cache.layers
        assert len(_written_slots(layers[0])) == n and len(_written_slots(layers[1])) == min(n, W)
        if previous is not None and n > W:  # the ring wraps: slot (n - 1) mod W is overwritten, the others kept
            slot = (n - 1) % W
            old, new = np.asarray(previous[1].k, np.float32), np.asarray(layers[1].k, np.float32)
            assert not np.array_equal(old[..., slot], new[..., slot])
            assert np.array_equal(np.delete(old, slot, axis=-1), np.delete(new, slot, axis=-1))
        previous = layers
    assert [s.tokens for s in steps] == list(range(1, 11))
    assert disagreements(plan, steps) == []
    summary = dict(kind_summary(plan, steps[-1]))
    assert "wrapped 2x" in summary["1 sliding layer"] and "read 2 (its own chunk only)" in summary["1 chunked layer"]
    assert "reads again the cache of layer 1 (4 slots)" in summary["1 shared layer"]


def test_the_latent_holds_one_small_slot_per_token():
    plan = fill_plan(LATENT, tokens=5, cache_dtype="int8")
    steps = [step for step, _ in decode_fill(plan)]
    assert plan.per_slot == (16 + 8 + 4,) * 2  # C + R int8 codes and one float32 scale
    assert [s.held for s in steps] == [(n, n) for n in range(1, 6)] and disagreements(plan, steps) == []


def test_what_cannot_run_here_is_refused_in_one_line():
    with pytest.raises(ValueError, match="keys of 8 and values of 16") as err:
        fill_plan(UNEQUAL, 16)
    with pytest.raises(ValueError, match="above the labs' .* allocation guard; lower the tokens") as err2:
        fill_plan(TINY, 10, guard=1000)
    with pytest.raises(ValueError, match="at most max_position_embeddings = 64") as err3:
        fill_plan(TINY, 65)
    assert all("\n" not in str(e.value) for e in (err, err2, err3))


def test_the_panel_decodes_draws_any_step_and_stops_on_request(monkeypatch):
    from widgets import cache_fill_panel
    from widgets.cache_fill_panel import CacheFillPanel

    panel = CacheFillPanel(model="tiny hybrid", tokens=10,
                           archs={"tiny hybrid": TINY, "nemotron-h-8b": load_architecture("nemotron-h-8b"),
                                  "unequal heads": UNEQUAL})
    assert list(panel.model.options) == ["tiny hybrid", "nemotron-h-8b"]  # a model whose working model does not
    # build (Gated DeltaNet values wider than its keys) is not offered
    panel.run(wait=True)
    assert panel.error == "" and len(panel.steps) == 10 and (panel.step.max, panel.step.value) == (10, 10)
    assert "at every step so far" in panel.readout.value and "wrapped 2x" in panel.readout.value
    assert [t.name for t in panel.layers_fig.data] == ["full (measured)", "sliding (measured)", "chunked (measured)",
                                                      "shared (measured)", "linear (measured)", "ledger (derived)"]
    assert np.asarray(panel.heat_fig.data[0].z).shape == (5, 10)
    panel.step.value = 3
    assert "step 3 of 10" in panel.readout.value and tuple(panel.layers_fig.data[-1].y) == panel.steps[2].ledger
    assert not panel.decode_button.disabled and panel.stop_button.disabled

    def stopped_after_three(plan):  # the stop button pressed while the third step is drawn
        for n, item in enumerate(decode_fill(plan), 1):
            if n == 3:
                panel.stop_button.click()
            yield item
    monkeypatch.setattr(cache_fill_panel, "decode_fill", stopped_after_three)
    panel.run(wait=True)
    assert panel.stopped and len(panel.steps) == 3 and "stopped early" in panel.readout.value

    panel.tokens.value = 65  # past the model's context: refused in one line, on screen
    panel.run(wait=True)
    assert "max_position_embeddings = 64" in panel.error and "\n" not in panel.error
    assert "max_position_embeddings" in panel.status.value
