"""Variable ranges: each range fixture gives exactly its one-line message; shipped ranges are usable by a slider."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import content
from content import ranges
from content.schema import Variable

FIXTURES = Path(__file__).parent / "content_fixtures"

# fixture -> (text on the line the message must name, "field: message" after "<file>:<line>: ")
EXPECTED = {
    "range-default-outside.yaml": (
        "      L: {", "science[0].variables.L.default: expected a default from 1 to 128, got 256"),
    "range-log-through-zero.yaml": (
        "      T: {", "science[0].variables.T.scale: expected a range above zero for a log scale, got min 0"),
    "range-missing.yaml": (
        "      m: {", "science[0].variables.m: expected min, max and default (a range) or values and default "
                      "(allowed values), got neither"),
    "range-default-not-a-value.yaml": (
        "      m: {", "science[0].variables.m.default: expected one of the values 8, 16, 32, got 12"),
    "range-not-finite.yaml": (
        "    compute: L", "science[0].compute: expected a finite result at the defaults, ends and corners of the "
                          "variables' ranges; at L=1, T=8, m=16: expected a non-zero divisor for '/', got 0"),
    "range-spec-outside.yaml": (
        "      with: {", "specs[0].compute.with.L: expected a value inside the range of L in 'Cache size' "
                         "(4 to 128 in whole steps), got 2"),
    "range-fractional-integer.yaml": (
        "      m: {", "science[0].variables.m.integer: expected whole-number bounds, default and values with "
                      "integer: true, got 0.5"),
}


def _expected_line(name: str) -> str:
    marker, message = EXPECTED[name]
    path = FIXTURES / name
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(marker))
    return f"{path}:{line}: {message}"


def test_every_range_fixture_is_listed():
    assert {p.name for p in FIXTURES.glob("range-*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_range_fixture_gives_exactly_its_message(name):
    entries, problems = content.validate_files([FIXTURES / name])
    assert [str(p) for p in problems] == [_expected_line(name)]
    assert entries == []


@pytest.mark.parametrize("name", ["range-default-outside.yaml", "range-not-finite.yaml"])
def test_load_entry_refuses_with_the_same_line(name, tmp_path):
    shutil.copytree(content.CONTENT_DIR, tmp_path, dirs_exist_ok=True)
    shutil.copy(FIXTURES / name, tmp_path / name)
    with pytest.raises(content.ContentError) as err:
        content.load_entry(Path(name).stem, root=tmp_path)
    assert str(err.value) == _expected_line(name).replace(str(FIXTURES / name), str(tmp_path / name))


def test_command_prints_one_line_per_range_fixture():
    script = Path(sys.executable).with_name("dantinox")
    paths = [str(FIXTURES / name) for name in sorted(EXPECTED)]
    done = subprocess.run([str(script), "content", "check", *paths], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout.splitlines() == sorted(_expected_line(name) for name in EXPECTED)


def _var(**fields) -> Variable:
    return Variable.model_validate({"meaning": "m", "unit": "u", **fields})


@pytest.mark.parametrize("fields,integer", [
    ({"min": 1, "max": 128, "default": 2}, True),
    ({"min": 1, "max": 128, "default": 2, "integer": False}, False),
    ({"min": 0.5, "max": 8, "default": 2}, False),
    ({"values": [1, 2, 4], "default": 2}, True),
    ({"values": [0.5, 1], "default": 1}, False),
    ({"min": 1.0e11, "max": 1.0e13, "default": 4.8e12, "scale": "log"}, True),
])
def test_whole_steps_are_inferred_from_whole_numbers(fields, integer):
    var = _var(**fields)
    assert ranges.variable_problem(var) is None
    assert ranges.is_integer(var) is integer
    assert isinstance(ranges.as_number(var, var.default), int) is integer


@pytest.mark.parametrize("fields,problem", [
    ({"min": 1, "max": 1, "default": 1}, ("max", "expected more than min (1), got 1")),
    ({"min": 1, "default": 1}, ("max", "expected both min and max, got no max")),
    ({"min": 1, "max": 4}, ("default", "expected a default from 1 to 4, got none")),
    ({"min": 1, "max": 4, "default": 2, "values": [1, 2]},
     ("values", "expected either min and max (a range) or values (allowed values), got both")),
    ({"values": [2, 2], "default": 2}, ("values", "expected two or more distinct allowed values, got 2, 2")),
    ({"values": [1, 2], "default": 1, "scale": "log"},
     ("scale", "expected no scale with values (they are shown as a list), got 'log'")),
    ({"min": -4, "max": 4, "default": 1, "scale": "log"},
     ("scale", "expected a range above zero for a log scale, got min -4")),
])
def test_variable_rules(fields, problem):
    assert ranges.variable_problem(_var(**fields)) == problem


def test_corner_points_are_defaults_then_ends_then_corners():
    item = content.load_entry("kv-cache").science_item("KV cache per token")
    points = list(ranges.corner_points(item))
    k = len(item.variables)
    assert len(points) == 1 + 2 * k + 2**k
    assert points[0] == {n: v.default for n, v in item.variables.items()}
    assert points[1] == {**points[0], "L": 1}
    assert all(isinstance(v, int) for p in points for v in p.values())


def test_every_shipped_variable_has_a_usable_range_and_every_spec_input_fits():
    for entry in content.load_all().values():
        for item in entry.science:
            for name, var in item.variables.items():
                assert ranges.variable_problem(var) is None, (entry.id, item.title, name)
                lo, hi = ranges.bounds(var)
                assert lo <= var.default <= hi and lo < hi
        for spec in entry.specs:
            if spec.compute is not None:
                item = entry.science_item(spec.compute.science)
                assert all(ranges.contains(item.variables[n], v) for n, v in spec.compute.with_.items())
