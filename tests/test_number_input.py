"""The one control for typed numbers: taken exactly or refused in one line, the same rule in every lab."""

import pytest
import traitlets

from content.units import parse_number
from widgets._controls import check_value
from widgets.number_input import NumberInput, stops


def tokens(**kw):
    return NumberInput(**{"value": 32_768, "min": 1, "max": 131_072, "scale": "log", "description": "tokens T",
                          "unit": "tokens", **kw})


def test_a_value_inside_the_range_is_used_exactly_even_off_the_grid():
    t = tokens(grid=[2**k for k in range(18)])
    assert t.type("100,000") is True
    assert t.value == 100_000 and t.box.value == "100,000"  # the formula's number, as typed
    assert t.slider.value == 131_072  # the slider at the nearest stop (by ratio)
    assert "100,000" in t.message and "nearest stop, 131,072" in t.message and t.message in t.note.value
    assert t.type("4096") is True and t.value == 4096 and t.slider.value == 4096
    assert t.message == "tokens T = 4,096 tokens, as typed"


def test_the_box_is_what_a_learner_types_into():
    t = tokens()
    t.box.value = "32768"  # Enter in the box (continuous_update=False)
    assert t.value == 32_768 and t.box.value == "32,768"
    t.box.value = "1000"
    assert t.value == 1000  # not snapped to a log grid (was 967)


def test_outside_the_range_one_line_gives_the_range_and_nothing_changes():
    t = tokens()
    seen = []
    t.observe(lambda c: seen.append(c["new"]), names="value")
    assert t.type("200000") is False
    assert t.value == 32_768 and t.box.value == "32,768" and not seen
    assert t.message == ("tokens T: expected a whole number from 1 to 131,072 tokens, got 200,000; kept 32,768")
    assert t.type("100.5") is False and "whole number" in t.message and t.value == 32_768
    assert t.type("many") is False and "got 'many'" in t.message and t.value == 32_768


def test_a_decimal_comma_is_refused_never_read_as_thousands():
    rate = NumberInput(value=0.5, min=0.1, max=2.0, integer=False, description="requests per step")
    assert rate.type("2,91") is False and rate.value == 0.5
    assert "decimal point (2.91)" in rate.message
    assert rate.type("1.25") is True and rate.value == 1.25  # off the 0.1 grid, used as typed
    with pytest.raises(ValueError, match="decimal point"):
        parse_number("2,91")
    assert parse_number("4,096") == 4096 and parse_number("6,291,456.5") == 6291456.5
    for bad in ("40,96", "1,0000", ",5"):
        with pytest.raises(ValueError):
            parse_number(bad)


def test_a_slider_move_takes_the_stop_and_clears_the_line():
    t = tokens()
    t.type("5")
    t.slider.value = t.slider.options[-1][1]
    assert t.value == 131_072 and t.message == "" and t.box.value == "131,072"


def test_code_is_checked_like_typing_and_a_narrower_range_is_announced():
    t = tokens()
    with pytest.raises(traitlets.TraitError, match="expected a whole number from 1 to 131,072"):
        t.value = 200_000
    with pytest.raises(ValueError, match=r"^T: expected an integer in \[1, 131072\], got 200000$"):
        check_value(t, 200_000, "T")
    check_value(t, 99_999, "T")  # off the grid is fine
    t.max = 8192
    assert t.value == 8192 and t.message == "tokens T moved from 32,768 to 8,192: the range is now 1 to 8,192"
    assert t.slider.options[-1][1] == 8192


def test_a_rule_of_the_quantity_refuses_in_the_same_line():
    def even(x):
        if x % 2:
            raise ValueError(f"rope: RoPE rotates pairs of channels, so its width must be even, got {x}")
    rope = NumberInput(value=8, min=2, max=32, description="RoPE key width R", check=even)
    assert rope.type("7") is False and rope.value == 8 and "must be even, got 7; kept 8" in rope.message
    batch = NumberInput(value=8, min=2, max=64, multiple_of=2, description="batch B")
    assert batch.type("9") is False and "in steps of 2" in batch.message and batch.value == 8
    assert [v for _, v in batch.slider.options][:3] == [2, 4, 6]
    with pytest.raises(ValueError, match=r"^batch: expected an integer in \[2, 64\] in steps of 2, got 9$"):
        check_value(batch, 9, "batch")


def test_stops_hold_both_ends_and_disabled_reaches_both_parts():
    assert stops(1, 10, integer=True) == list(range(1, 11))
    log = stops(1, 131_072, integer=True, scale="log", n=16)
    assert log[0] == 1 and log[-1] == 131_072 and len(log) <= 17
    t = tokens()
    t.disabled = True
    assert t.slider.disabled and t.box.disabled
