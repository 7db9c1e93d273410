"""The formula explorer, headless: every shipped science item, every control at min, max and default, equals
content.evaluate; spec inputs load in one click; bad values raise; content text is escaped."""

from __future__ import annotations

import html
import math
import re

import pytest

import content
from content import ranges
from widgets import FormulaExplorer, read_formula
from widgets.formula_explorer import GRID_STEPS, label, substitute, value_grid

ENTRIES = content.load_all()
ITEMS = [(eid, item.title) for eid, e in sorted(ENTRIES.items()) for item in e.science]


def _check_shown(explorer: FormulaExplorer, entry, title: str) -> None:
    values = explorer.values
    want = content.evaluate(entry, title, **values)
    reading = explorer.reading
    assert explorer.error == "" and reading is not None
    assert reading.science == title and reading.values == values and reading.result == want
    assert html.escape(reading.result_text) in explorer.formula_html.value
    assert html.escape(reading.substituted) in explorer.formula_html.value
    line, point = explorer.figure.data
    x = explorer.x_axis.value
    assert list(point.x) == [values[x]] and list(point.y) == [pytest.approx(want)]
    k = len(line.x) // 2  # one point of the curve, recomputed through the content API
    at = {**values, x: line.x[k]}
    assert line.y[k] == pytest.approx(content.evaluate(entry, title, **at))


@pytest.mark.parametrize("entry_id,title", ITEMS)
def test_every_control_at_min_max_and_default_shows_content_evaluate(entry_id, title):
    entry = ENTRIES[entry_id]
    explorer = FormulaExplorer(entry, science=title)
    item = entry.science_item(title)
    assert list(explorer.controls) == list(item.variables)
    defaults = {n: ranges.as_number(v, v.default) for n, v in item.variables.items()}
    assert explorer.values == defaults
    _check_shown(explorer, entry, title)
    for name, var in item.variables.items():
        lo, hi = ranges.bounds(var)
        for value in (lo, hi, var.default):
            explorer.set(**{name: ranges.as_number(var, value)})
            _check_shown(explorer, entry, title)
        explorer.set(**{name: defaults[name]})


@pytest.mark.parametrize("entry_id", sorted(ENTRIES))
def test_controls_follow_the_ranges(entry_id):
    for item in ENTRIES[entry_id].science:
        for name, var in item.variables.items():
            grid = value_grid(var)
            lo, hi = ranges.bounds(var)
            assert grid == sorted(set(grid)) and grid[0] == lo and grid[-1] == hi and var.default in grid
            if ranges.is_integer(var):
                assert all(isinstance(v, int) for v in grid), name
            pairs = list(zip(grid, grid[1:], strict=False))
            if var.values is None and var.scale == "log":  # no big jumps on the scale the slider uses
                assert max(b / a for a, b in pairs) <= max(2, (hi / lo) ** (2 / GRID_STEPS)), (item.title, name)
            elif var.values is None:
                assert max(b - a for a, b in pairs) <= max(1, 2 * (hi - lo) / GRID_STEPS), (item.title, name)
            assert len({label(v) for v in grid}) == len(grid)  # every position reads differently


def test_plot_against_any_variable_marks_the_current_point():
    entry = ENTRIES["kv-cache"]
    explorer = FormulaExplorer(entry, "KV cache size")
    explorer.set(T=4096, B=8)
    explorer.x_axis.value = "B"
    line, point = explorer.figure.data
    assert list(point.x) == [8] and explorer.figure.layout.xaxis.type == "log"
    for x, y in zip(line.x, line.y, strict=True):
        assert y == content.evaluate(entry, "KV cache size", **{**explorer.values, "B": x})
    assert explorer.figure.layout.xaxis.title.text == "B [sequences]"


@pytest.mark.parametrize("entry_id", sorted(ENTRIES))
def test_one_click_loads_every_computed_spec(entry_id):
    entry = ENTRIES[entry_id]
    explorer = FormulaExplorer(entry)
    for i, spec in enumerate(entry.specs):
        if spec.compute is None:
            continue
        explorer.load_spec(i)
        assert explorer.item.title == spec.compute.science
        assert explorer.values == spec.compute.with_
        assert explorer.reading.result == content.evaluate(entry, spec.compute.science, **spec.compute.with_)
        buttons = explorer.specs_box.children
        assert any(b.description == f"load: {spec.label}" for b in buttons)


def test_spec_button_click_loads_its_numbers():
    entry = ENTRIES["kv-cache"]
    explorer = FormulaExplorer(entry, "KV cache size")
    index = next(i for i, s in enumerate(entry.specs) if s.compute and s.compute.science == "KV cache size")
    button = next(b for b in explorer.specs_box.children if b.description == f"load: {entry.specs[index].label}")
    button.click()
    assert explorer.values == entry.specs[index].compute.with_


def test_values_a_control_cannot_show_are_refused_in_one_line():
    explorer = FormulaExplorer(ENTRIES["kv-cache"], "KV cache size")
    with pytest.raises(ValueError) as err:
        explorer.set(T=100_000_000)
    message = str(err.value)
    assert message.startswith("T: expected a value the control takes (a whole number from 1 to 131,072") \
        and "\n" not in message
    with pytest.raises(ValueError, match=r"^T: expected a value the control takes"):
        explorer.set(T=100.5)
    with pytest.raises(ValueError, match=r"^bytes: expected a value the control offers \(one of 1, 2, 4"):
        explorer.set(bytes=3)
    with pytest.raises(ValueError, match=r"^K: expected a variable of 'KV cache size' \(L, B, T, H_kv, d_h, bytes\)"):
        explorer.set(K=8)
    with pytest.raises(ValueError, match=r"^science: expected one of 'KV cache size', 'KV cache per token'"):
        explorer.select("KV size")
    with pytest.raises(ValueError, match=r"^index: expected a computed spec of 'kv-cache'"):
        explorer.load_spec(4)  # a spec in words


def test_read_formula_is_the_pure_reading():
    entry = ENTRIES["paged-attention"]
    reading = read_formula(entry, "Pages per sequence", {"T": 1000, "P": 16})
    assert reading.result == 63 and reading.substituted == "ceil(1,000 / 16)"
    assert reading.result_text == "63 pages"
    assert substitute("L * 2 ** x", {"L": 4096, "x": 3}) == "4,096 × 2 ^ 3"
    assert read_formula(ENTRIES["kv-cache"], 0, {"L": 12, "B": 1, "T": 512, "H_kv": 8, "d_h": 32, "bytes": 2}
                        ).result_text == "6,291,456 B = 6 MiB"


def test_content_text_is_escaped():
    entry = ENTRIES["kv-cache"]
    item = entry.science[0]
    evil = "<script>alert('x')</script>"
    variables = {n: v.model_copy(update={"meaning": evil}) if n == "T" else v for n, v in item.variables.items()}
    item = item.model_copy(update={"equation": evil, "variables": variables})
    explorer = FormulaExplorer(entry.model_copy(update={"science": [item, *entry.science[1:]]}))
    shown = explorer.formula_html.value + "".join(c.value for c in explorer.controls_box.children
                                                  if isinstance(getattr(c, "value", None), str))
    assert "<script>" not in shown and html.escape(evil) in shown
    titled = entry.model_copy(update={"science": [entry.science[0].model_copy(update={"title": evil}),
                                                  *entry.science[1:]], "specs": []})
    explorer = FormulaExplorer(titled)
    assert explorer.figure.layout.title.text.startswith(html.escape(evil))
    assert "<script>" not in explorer.formula_html.value
    assert math.isfinite(explorer.reading.result)


def test_a_typed_value_is_used_exactly_even_between_the_slider_stops():
    """T = 32768 became 33,973 (the log grid's nearest), 1000 -> 967, 500 -> 512, d_h 100 -> 99."""
    entry = ENTRIES["kv-cache"]
    explorer = FormulaExplorer(entry, science="KV cache size")
    stops = [v for _, v in explorer.controls["T"].slider.options]
    for name, typed, value in (("T", "32768", 32_768), ("T", "1000", 1000), ("T", "500", 500), ("d_h", "100", 100),
                               ("T", "4,100", 4100)):
        explorer.boxes[name].value = typed  # what pressing Enter in the box does
        assert explorer.values[name] == value and explorer.error == ""
        assert explorer.reading.values[name] == value and f"{value:,}" in explorer.reading.substituted
        assert explorer.boxes[name].value == label(value)  # the box shows what the formula uses
    assert 1000 not in stops and explorer.controls["T"].slider.value in stops  # the slider at its nearest stop
    assert "nearest stop" in explorer.controls["T"].message
    assert explorer.reading.result == content.evaluate(entry, "KV cache size", **explorer.values)
    _check_shown(explorer, entry, "KV cache size")
    explorer.boxes["L"].value = "64/2"  # a fraction is a number too
    assert explorer.values["L"] == 32
    assert explorer.set(T=33_000).values["T"] == 33_000  # code takes any value in range too


@pytest.mark.parametrize("typed,message", [
    ("abc", r"T: expected a whole number from 1 to 131,072 tokens, got 'abc'"),
    ("200000", r"T: expected a whole number from 1 to 131,072 tokens, got 200,000"),
    ("1/0", "T: expected a whole number"),
    ("2,91", r"T: expected .* got '2,91' \(use a decimal point"),
    ("100.5", r"T: expected a whole number .* got 100.5")])
def test_a_typed_value_the_control_cannot_take_is_refused_visibly(typed, message):
    explorer = FormulaExplorer(ENTRIES["kv-cache"], science="KV cache size")
    before = explorer.values["T"]
    explorer.boxes["T"].value = typed
    assert re.search(message, explorer.error) and "kept 512" in explorer.error
    assert explorer.values["T"] == before and explorer.boxes["T"].value == label(before)  # nothing half-applied
    assert html.escape(explorer.error) in explorer.status_html.value
    assert explorer.controls["T"].message == explorer.error  # also in the control's own line
    explorer.boxes["T"].value = "1000"  # the next good value clears the message
    assert explorer.error == "" and explorer.values["T"] == 1000 and explorer.status_html.value == ""


def test_grids_equal_numpys_linspace_and_geomspace():
    """The explorer's grids are computed without numpy (the browser has none). linspace gives numpy's floats
    exactly; geomspace has numpy's exact ends, and inside them it may differ by one unit in the last place:
    Python's `10.0 ** x` is the C library's pow, numpy's `power` its own (numpy 2.4.6 rounds 10 ** 2.1448... the
    other way). The grid a learner sees is the same in the kernel and in the browser: both run this code."""
    import math

    import numpy as np

    from widgets.formula_explorer import geomspace, linspace

    for lo, hi in [(1, 4096), (0.001, 7.5), (3, 3e9), (16, 131072), (0.25, 0.5)]:
        for n in (2, 3, GRID_STEPS + 1):
            assert linspace(lo, hi, n) == np.linspace(lo, hi, n).tolist()
            ours, numpys = geomspace(lo, hi, n), np.geomspace(lo, hi, n).tolist()
            assert len(ours) == n and ours[0] == lo and ours[-1] == hi and numpys[0] == lo and numpys[-1] == hi
            off = [(a, b) for a, b in zip(ours, numpys, strict=True) if abs(a - b) > math.ulp(b)]
            assert not off, f"geomspace({lo}, {hi}, {n}) differs from numpy's by more than one ulp: {off[:3]}"
            assert ours == sorted(set(ours)), f"geomspace({lo}, {hi}, {n}) is not strictly increasing"
