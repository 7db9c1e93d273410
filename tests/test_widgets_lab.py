"""The cache lab and its plot, driven headless: move controls, compare the lab's reading with the pure one."""

import jax
import pytest
from compile_log import compile_log

import content
import dantinox
import widgets.cache_lab
from widgets import CacheLab, CachePlot, read_kv_cache


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


@pytest.fixture
def lab(entry):
    return CacheLab(entry, preset="test", tokens=32, attention="gqa", cache_dtype="bfloat16")


def pure(lab):
    """What read_kv_cache gives for the lab's current controls."""
    return read_kv_cache(lab.entry, lab.config(), lab.batch.value, lab.tokens.value, device=lab.device.value,
                         budget=lab.budget_bytes)


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lab_shows_the_pure_reading_of_its_controls(lab, attention, dtype):
    lab.attention.value = attention
    lab.cache_dtype.value = dtype
    for tokens, batch in ((1, 1), (17, 3), (64, 5)):
        lab.tokens.value = tokens
        lab.batch.value = batch
        r = lab.reading
        assert lab.error == "" and r == pure(lab)
        assert (r.tokens, r.batch, r.cfg.variant, r.cfg.cache_dtype) == (tokens, batch, attention, dtype)
        assert r.source == "arrays" and r.residual == 0


def test_render_smoke_formula_and_readouts_carry_the_reading(entry):
    lab = CacheLab(entry, preset="reference", tokens=512, attention="mha", cache_dtype="bfloat16")
    r = lab.reading
    assert "12 × 2 × 1 × 512 × 8 × 32 × 2 = 6,291,456 B = 6 MiB" in lab.formula_html.value
    for text in (f"{r.measured_bytes:,} B", f"{r.max_batch:,} sequences", "measured", "derived"):
        assert text in lab.readout_html.value
    assert lab.status_html.value == ""


def test_one_update_is_one_reading(lab):
    readings = []
    lab.observe(lambda change: readings.append(change["new"]), names="reading")
    r = lab.update(tokens=20, batch=4, attention="mha", cache_dtype="float32", device="A100 80GB")
    assert readings == [r] and (r.tokens, r.batch, r.cfg.variant, r.device.name) == (20, 4, "mha", "A100 80GB")
    lab.tokens.value = 21  # a learner's move: one more
    assert len(readings) == 2 and readings[-1].tokens == 21


def test_kv_head_choices_follow_the_variant_and_the_preset(entry):
    lab = CacheLab(entry, preset="reference", attention="gqa")
    assert list(lab.kv_heads.options) == [2, 4] and not lab.kv_heads.disabled
    lab.attention.value = "mha"
    assert list(lab.kv_heads.options) == [8] and lab.kv_heads.disabled and lab.reading.cfg.n_kv_heads == 8
    lab.attention.value = "mqa"
    assert list(lab.kv_heads.options) == [1] and lab.reading.cfg.n_kv_heads == 1
    lab.attention.value = "gqa"
    lab.kv_heads.value = 4
    assert lab.reading.cfg.n_kv_heads == 4
    lab.preset.value = "test"
    assert lab.tokens.max == 64 and lab.tokens.value <= 64
    assert list(lab.kv_heads.options) == [2] and lab.reading.cfg.n_heads == 4


def test_bad_programmatic_values_raise_instead_of_clamping(lab):
    with pytest.raises(ValueError, match=r"^tokens: expected an integer in \[1, 64\], got 65$"):
        lab.update(tokens=65)
    with pytest.raises(ValueError, match="^kv_heads: expected one of 2, got 3$"):
        lab.update(kv_heads=3)
    with pytest.raises(ValueError, match="^update: unknown control"):
        lab.update(layers=3)
    with pytest.raises(ValueError, match="^budget_bytes: expected a non-negative integer, got -1$"):
        CacheLab(lab.entry, budget_bytes=-1)
    assert lab.reading.tokens == 32  # nothing was half-applied


def test_memory_guard_switches_to_shapes_above_the_budget(entry):
    lab = CacheLab(entry, preset="test", tokens=8, attention="mha", cache_dtype="float32", budget_bytes=20_000)
    assert lab.reading.source == "arrays" and lab.status_html.value == ""  # 8 KiB: allocated
    lab.tokens.value = 64  # 64 KiB > budget: sized from shapes, nothing allocated
    big = lab.reading
    assert big == pure(lab) and big.source == "shapes" and big.residual == 0
    assert "Memory guard" in lab.status_html.value
    lab.tokens.value = 8
    assert lab.reading.source == "arrays" and lab.status_html.value == ""


def test_allocating_real_arrays_leaves_none_behind(lab):
    lab.update(tokens=5)  # compile the fill for this shape before counting
    before = len(jax.live_arrays())
    for t in (6, 7, 8, 6, 7, 8):
        lab.tokens.value = t
    assert len(jax.live_arrays()) == before


def test_revisiting_settings_compiles_nothing(lab):
    for t in (9, 10):
        lab.tokens.value = t  # first visits: the zero-fill compiles per shape
    with compile_log() as compiled:
        for t in (9, 10, 9):
            lab.tokens.value = t
        lab.cache_dtype.value = "float32"
        lab.cache_dtype.value = "bfloat16"
        lab.tokens.value = 10
    assert [n for n in compiled if "broadcast_in_dim" not in n and "convert_element_type" not in n] == []
    assert compiled.count("jit(broadcast_in_dim)") <= 2  # the float32 fills of T=9: keys, values


def test_errors_are_shown_in_the_lab_not_swallowed(lab, monkeypatch):
    def broken(*_, **__):
        raise RuntimeError("allocator exploded")

    monkeypatch.setattr(widgets.cache_lab, "read_kv_cache", broken)
    lab.tokens.value = 9
    assert lab.error == "RuntimeError: allocator exploded" and lab.reading.tokens == 32
    assert "allocator exploded" in lab.status_html.value
    monkeypatch.undo()
    lab.tokens.value = 10
    assert lab.error == "" and lab.reading.tokens == 10


def test_plot_updates_in_place_with_derived_lines_and_measured_dots(lab):
    plot = CachePlot(lab)
    fig = plot.figure
    traces = list(fig.data)
    assert [t.name for t in traces[:3]] == ["MHA (K=4), derived", "GQA (K=2), derived (current)",
                                            "MQA (K=1), derived"]
    line_y = traces[1].y
    for t in (10, 20, 30):
        lab.tokens.value = t
    assert list(fig.data) == traces  # the same trace objects, updated in place
    dots = fig.data[3]
    assert list(dots.x) == [10, 20, 30, 32]
    assert list(dots.customdata) == [dantinox.kv_cache_bytes(lab.reading.cfg, 1, t) for t in (10, 20, 30, 32)]
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
    assert "not allocated" in shapes.name


def test_a_typed_token_count_is_used_exactly_or_refused_in_one_line(lab):
    assert lab.tokens.type("37") and lab.reading.tokens == 37 and lab.error == ""
    assert not lab.tokens.type("65") and lab.reading.tokens == 37
    assert lab.tokens.message == "tokens T: expected a whole number from 1 to 64 tokens, got 65; kept 37"
    assert not lab.batch.type("2,5") and "decimal point" in lab.batch.message and lab.reading.batch == 1


def test_the_plot_axis_takes_the_unit_that_fits_its_numbers(entry):
    from widgets.plot import byte_unit

    assert [byte_unit(n)[0] for n in (0, 1023, 1024, 5 * 2**20, 2**30, 2**50)] == ["B", "B", "KiB", "MiB", "GiB",
                                                                                   "TiB"]
    lab = CacheLab(entry, preset="test", tokens=8, attention="mha", cache_dtype="float32")
    plot = CachePlot(lab)
    largest = max(max(t.customdata) for t in plot.figure.data[:3])
    unit, factor = byte_unit(largest)
    assert plot.figure.layout.yaxis.title.text == f"KV cache ({unit})" and unit == "KiB"
    assert plot.figure.data[0].y[-1] == pytest.approx(plot.figure.data[0].customdata[-1] / factor)
    lab.update(preset="reference", batch=256)  # ~1e5 MiB stayed in MiB
    assert max(plot.figure.data[0].y) < 1024 and plot.figure.layout.yaxis.title.text.endswith("(GiB)")


def test_a_slow_recomputation_says_it_is_working_and_holds_the_controls_a_quick_one_does_not(lab, monkeypatch):
    """A setting whose cache is built for the first time can take a second or more (1.0-1.7 s measured on this
    project's 2-core machine for a new attention or dtype of the reference model); the lab says so in its live
    status line and disables its controls meanwhile, and gives both back after."""
    import time

    from widgets._a11y import LIVE

    seen, real = [], widgets.cache_lab.read_kv_cache

    def slow(*args, **kwargs):  # holds the refresh until the working state is on screen (at most 10 s)
        deadline = time.monotonic() + 10
        while not lab.attention.disabled and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append((lab.status_html.value, [getattr(lab, c).disabled for c in lab.CONTROLS]))
        return real(*args, **kwargs)

    monkeypatch.setattr(widgets.cache_lab, "read_kv_cache", slow)
    lab.attention.value = "mha"  # MHA: one choice of K, so its dropdown is disabled by the variant, not the work
    status, disabled = seen[0]
    assert "working… building this setting's cache" in status and all(disabled)
    assert LIVE in lab.status_html._dom_classes and "working" not in lab.status_html.value
    assert lab.reading.cfg.variant == "mha" and lab.kv_heads.disabled  # the variant's own state comes back
    assert not any(getattr(lab, c).disabled for c in lab.CONTROLS if c != "kv_heads")
    monkeypatch.setattr(widgets.cache_lab, "read_kv_cache", real)
    states = []
    lab.observe(lambda _: states.append(lab.tokens.disabled), names="reading")
    lab.attention.value = "gqa"  # built when the lab started: milliseconds, well under WORKING_AFTER_S
    assert states == [False] and "working" not in lab.status_html.value  # no flicker, nothing said
