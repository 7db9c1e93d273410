"""The cache lab and its plot, driven headless: set control values, read the readouts."""

import jax
import pytest

import content
import dantinox
from widgets import CacheLab, CachePlot


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


@pytest.fixture
def lab(entry):
    return CacheLab(entry, preset="test", tokens=32, attention="gqa", cache_dtype="bfloat16")


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sliders_move_formula_and_real_arrays_together(lab, attention, dtype):
    lab.attention.value = attention
    lab.cache_dtype.value = dtype
    for tokens, batch in ((1, 1), (17, 3), (64, 5)):
        lab.tokens.value = tokens
        lab.batch.value = batch
        r = lab.reading
        assert lab.error == ""
        assert (r.tokens, r.batch, r.cfg.attention, r.cfg.cache_dtype) == (tokens, batch, attention, dtype)
        assert r.source == "arrays"
        assert r.measured_bytes == dantinox.tree_nbytes(dantinox.init_cache(r.cfg, batch, tokens))
        assert r.formula_bytes == dantinox.kv_cache_bytes(r.cfg, batch, tokens)
        assert r.residual == 0
        assert ">0 B<" in lab.readout_html.value


def test_reference_bf16_mha_at_512_tokens_is_6_mib_not_0_375_mb(entry):
    lab = CacheLab(entry, preset="reference", tokens=512, attention="mha", cache_dtype="bfloat16")
    r = lab.reading
    assert r.formula_bytes == r.measured_bytes == 6 * 2**20
    assert "6 MiB" in lab.readout_html.value
    assert "12 × 2 × 1 × 512 × 8 × 32 × 2 = 6,291,456 B = 6 MiB" in lab.formula_html.value


def test_readouts_per_token_growth_and_batch_calculator(lab):
    lab.update(device="A100 40GB", tokens=40)
    r = lab.reading
    assert r.per_token_bytes == dantinox.kv_cache_bytes(r.cfg, 1, 1)
    assert r.max_batch == dantinox.max_batch_size(r.cfg, 40 * 10**9, 40)
    assert f"{r.max_batch:,} sequences" in lab.readout_html.value
    for kind in ("measured", "derived"):
        assert kind in lab.readout_html.value


def test_kv_head_choices_follow_the_variant_and_the_preset(entry):
    lab = CacheLab(entry, preset="reference", attention="gqa")
    assert list(lab.kv_heads.options) == [2, 4] and not lab.kv_heads.disabled
    lab.attention.value = "mha"
    assert list(lab.kv_heads.options) == [8] and lab.kv_heads.disabled and lab.reading.cfg.kv_heads == 8
    lab.attention.value = "mqa"
    assert list(lab.kv_heads.options) == [1] and lab.reading.cfg.kv_heads == 1
    lab.attention.value = "gqa"
    lab.kv_heads.value = 4
    assert lab.reading.cfg.kv_heads == 4
    lab.preset.value = "test"
    assert lab.tokens.max == 64 and lab.tokens.value <= 64
    assert list(lab.kv_heads.options) == [2] and lab.reading.cfg.n_heads == 4


def test_bad_programmatic_values_raise_instead_of_clamping(lab):
    with pytest.raises(ValueError, match=r"tokens: expected an integer in \[1, 64\], got 65"):
        lab.update(tokens=65)
    with pytest.raises(ValueError, match="kv_heads: expected one of 2, got 3"):
        lab.update(kv_heads=3)
    with pytest.raises(ValueError, match="update: unknown control"):
        lab.update(layers=3)
    with pytest.raises(ValueError, match="budget_bytes"):
        CacheLab(lab.entry, budget_bytes=0)


def test_memory_guard_switches_to_shapes_above_the_budget(entry):
    lab = CacheLab(entry, preset="test", tokens=8, attention="mha", cache_dtype="float32", budget_bytes=20_000)
    small = lab.reading  # 2 layers · 2 · 8 tokens · 4 heads · 8 · 4 B = 8 KiB: allocated
    assert small.source == "arrays" and lab.status_html.value == ""
    lab.tokens.value = 64  # 64 KiB > budget: sized from shapes, nothing allocated
    big = lab.reading
    assert big.source == "shapes" and big.residual == 0
    assert big.measured_bytes == dantinox.kv_cache_bytes(big.cfg, 1, 64)
    assert "Memory guard" in lab.status_html.value and "eval_shape" in lab.status_html.value
    assert "nothing allocated" in lab.readout_html.value
    lab.tokens.value = 8
    assert lab.reading.source == "arrays" and lab.status_html.value == ""


def test_allocating_real_arrays_leaves_none_behind(lab):
    lab.update(tokens=5)  # compile the fill for this shape before counting
    before = len(jax.live_arrays())
    for t in (6, 7, 8, 6, 7, 8):
        lab.tokens.value = t
    assert len(jax.live_arrays()) == before


def test_errors_are_shown_in_the_lab_not_swallowed(lab, monkeypatch):
    def broken(*_):
        raise RuntimeError("allocator exploded")

    monkeypatch.setattr(lab, "measure", broken)
    lab.tokens.value = 9
    assert lab.error == "RuntimeError: allocator exploded"
    assert "allocator exploded" in lab.status_html.value
    monkeypatch.undo()
    lab.tokens.value = 10
    assert lab.error == "" and lab.reading.tokens == 10


def test_plot_updates_in_place_with_derived_lines_and_measured_dots(lab):
    plot = CachePlot(lab)
    fig = plot.figure
    traces = list(fig.data)
    names = [t.name for t in traces]
    assert names[:3] == ["MHA (K=4), derived", "GQA (K=2), derived (current)", "MQA (K=1), derived"]
    assert "derived" in fig.layout.title.text and "measured" in fig.layout.title.text
    line_y = traces[1].y
    for t in (10, 20, 30):
        lab.tokens.value = t
    assert list(fig.data) == traces  # the same trace objects, updated in place
    dots = fig.data[3]
    assert list(dots.x) == [10, 20, 30, 32]
    assert [round(b) for b in dots.customdata] == [dantinox.kv_cache_bytes(lab.reading.cfg, 1, t)
                                                   for t in (10, 20, 30, 32)]
    assert fig.data[1].y == line_y  # T moves do not recompute the lines
    lab.batch.value = 2
    assert fig.data[1].y[-1] == pytest.approx(2 * line_y[-1])
    assert list(fig.data[3].x) == [30]  # a new batch starts a new set of dots


def test_plot_marks_shape_sized_points(entry):
    lab = CacheLab(entry, preset="test", tokens=8, attention="mha", cache_dtype="float32", budget_bytes=20_000)
    plot = CachePlot(lab)
    lab.tokens.value = 64
    arrays, shapes = plot.figure.data[3], plot.figure.data[4]
    assert list(arrays.x) == [8] and list(shapes.x) == [64]
    assert "not allocated" in shapes.name and "eval_shape" in plot.figure.layout.title.text
