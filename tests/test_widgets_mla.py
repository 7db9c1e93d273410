"""The MLA lab, driven headless: its reading is read_mla_cache of its sliders; its plot is updated in place."""

import pytest

import content
from widgets import MlaLab, read_mla_cache


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("multi-head-latent-attention")


@pytest.fixture
def lab(entry):
    return MlaLab(entry, preset="test", latent=16, rope=4, tokens=40, batch=3)


def test_the_lab_shows_the_pure_reading_of_its_sliders(lab):
    for latent, rope, tokens, batch in ((16, 4, 40, 3), (32, 8, 1, 1), (128, 32, 64, 2)):
        r = lab.update(latent=latent, rope=rope, tokens=tokens, batch=batch)
        assert lab.error == "" and r is lab.reading
        assert r == read_mla_cache(lab.entry, lab.kv_entry, lab.config(), batch, tokens,
                                   gqa_kv_heads=lab.gqa_kv_heads, budget=lab.budget_bytes)
        assert (r.cfg.kv_latent_dim, r.cfg.rope_head_dim, r.layer_shapes["ckv"]) == (latent, rope,
                                                                                    (batch, tokens, latent + rope))
        assert r.residual == 0 and all(p.residual == 0 for p in r.peers)


def test_render_smoke_formula_table_and_plot(lab):
    r = lab.reading
    assert f"= 2 × 3 × 40 × (16 + 4) × 2 = {r.formula_bytes:,} B" in lab.formula_html.value  # bf16
    for p in r.peers:
        assert f"{p.measured_bytes:,} B" in lab.readout_html.value
    assert [t.name for t in lab.figure.data[:4]] == ["MLA (C=16, R=4), derived (current)", "MHA (K=4), derived",
                                                      "GQA (K=2), derived", "MQA (K=1), derived"]


def test_slider_moves_update_the_same_traces(lab):
    traces = list(lab.figure.data)
    lab.latent.value = 32  # as a learner moves the slider: the same figure and traces, updated in place
    assert lab.reading.cfg.kv_latent_dim == 32 and list(lab.figure.data) == traces
    assert lab.figure.data[0].name == "MLA (C=32, R=4), derived (current)"
    assert lab.figure.data[0].customdata[-1] == lab.derived_bytes(lab.reading.cfg, 3, 64)
    lab.tokens.value = 50
    assert list(lab.figure.data[-3].x) == [40, 50]  # measured dots where the learner has been


def test_lab_refuses_bad_settings_and_guards_memory(entry):
    lab = MlaLab(entry, preset="test", latent=16, rope=4, budget_bytes=2**12)
    with pytest.raises(ValueError, match=r"^rope: expected an integer in \[2, 32\] in steps of 2, got 3$"):
        lab.update(rope=3)
    with pytest.raises(ValueError, match="^update: unknown control"):
        lab.update(heads=2)
    r = lab.update(tokens=64, batch=8)  # 2 layers x 8 x 64 x 20 x 4 B is far above a 4 KiB budget
    assert r.source == "shapes" and r.residual == 0 and "Memory guard" in lab.status_html.value
    with pytest.raises(ValueError, match="^gqa_kv_heads: expected a divisor of n_heads=4"):
        MlaLab(entry, preset="test", gqa_kv_heads=3)


def test_typed_widths_are_used_exactly_and_an_odd_rope_width_is_refused(lab):
    assert lab.latent.type("13") and lab.reading.cfg.kv_latent_dim == 13  # off the slider's steps of 8
    assert not lab.rope.type("3") and lab.reading.cfg.rope_head_dim == 4
    assert "in steps of 2, got 3; kept 4" in lab.rope.message
