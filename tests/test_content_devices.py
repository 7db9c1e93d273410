"""Device memory in content comes from one table by name, and a pull request is cited at a fixed state.

content/devices.yaml is content's copy of dantinox.accounting.memory.DEVICE_PRESETS (content imports no dantinox); the
first test keeps the two equal to the byte.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

import content
import dantinox
from content.devices import DeviceMemory, device_memory, devices, typed_capacity

BASE = Path(__file__).parent / "content_fixtures" / "base" / "fixture-base.yaml"
SPEC = "      with: {L: 2, T: 8, m: 16}"
LINK = "    appears_in: https://jax-ml.github.io/scaling-book/"
M_LINE = "      m: {meaning: bytes per token and layer, unit: B, min: 1, max: 4096, default: 16, scale: log}"
WIDE_M = ("      m: {meaning: bytes per token and layer, unit: B, min: 1, max: 4096, default: 16, scale: log}",
          "      m: {meaning: bytes per token and layer, unit: B, min: 1, max: 1.0e12, default: 16, scale: log}")


def test_the_content_device_table_equals_dantinox_presets_to_the_byte():
    presets = {name: p for name, p in dantinox.DEVICE_PRESETS.items() if not name.startswith("this machine")}
    table = devices()
    assert list(table) == list(presets)
    for name, device in table.items():
        assert device.memory_bytes == presets[name].memory_bytes, name
        assert device.source == presets[name].source, name
        assert str(device.rated_gb) + "GB" in name  # the rated figure is the one in the device's name


def _entry(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    text = BASE.read_text().replace("id: fixture-base", f"id: {name}", 1)
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _problems(path: Path) -> list[str]:
    _, problems = content.validate_files([path])
    return [f"{p.field}: {p.message}" for p in problems]


def test_a_named_device_gives_its_reported_bytes(tmp_path):
    path = _entry(tmp_path, "named-device", WIDE_M,
                  ("      with: {L: 2, T: 8, m: 16}", "      with: {L: 1, T: 1, m: {device_memory: H100 80GB}}"))
    (entry,), problems = content.validate_files([path])
    assert problems == []
    m = entry.specs[0].compute.with_["m"]
    assert isinstance(m, DeviceMemory) and m.device == "H100 80GB"
    assert m == dantinox.DEVICE_PRESETS["H100 80GB"].memory_bytes
    assert content.spec_value(entry, 0) == "79.647 GiB"
    assert content.device_inputs(entry.specs[0]) == \
        "From content/devices.yaml: m = H100 80GB memory as the device reports it (81,559 MiB)."
    assert content.device_inputs(entry.specs[1]) == ""


@pytest.mark.parametrize("typed,form", [
    ("85520809984", "the H100 80GB's reported memory"),
    ("8.1559e10", "the H100 80GB's reported MiB read as MB"),
    ("1.41e11", "the H200 141GB's rated capacity in GB"),
    ("4.2949672960e10", "the A100 40GB's reported memory"),
])
def test_every_form_of_a_known_capacity_is_refused_when_typed(tmp_path, typed, form):
    path = _entry(tmp_path, "typed", WIDE_M, (SPEC, f"      with: {{L: 1, T: 1, m: {typed}}}"))
    (problem,) = _problems(path)
    assert problem.startswith("specs[0].compute.with.m: expected {device_memory: <device>} naming ") and form in problem


def test_a_capacity_typed_in_a_scaled_unit_is_refused_and_other_units_are_not_checked(tmp_path):
    in_mib = _entry(tmp_path, "typed-mib",
                    (M_LINE,
                     "      m: {meaning: bytes per token and layer, unit: MiB, min: 1, max: 1.0e6, default: 16, "
                     "scale: log}"),
                    ("    unit: B\n    explanation: Multiply the three.", "    unit: MiB\n    explanation: Multiply."),
                    ("    unit: B\n    explanation: One record", "    unit: MiB\n    explanation: One record"),
                    ("      with: {L: 2, T: 8, m: 16}", "      with: {L: 1, T: 1, m: 143771}"))
    (problem,) = _problems(in_mib)
    assert "the H200 141GB's reported memory" in problem and "143,771" in problem
    tokens = _entry(tmp_path, "tokens-not-bytes",
                    ("      T: {meaning: tokens, unit: tokens, min: 1, max: 32768, default: 8, scale: log}",
                     "      T: {meaning: tokens, unit: tokens, min: 1, max: 1.0e12, default: 8, scale: log}"),
                    ("      with: {L: 2, T: 8, m: 16}", "      with: {L: 1, T: 8.0e10, m: 1}"))
    assert _problems(tokens) == []  # eighty billion tokens is not a capacity
    assert typed_capacity(8.0e10 * 1.01) == [] and typed_capacity(0) == []


def test_a_device_only_fills_a_variable_in_bytes_and_must_be_known(tmp_path):
    wrong_unit = _entry(tmp_path, "device-for-tokens",
                        ("      T: {meaning: tokens, unit: tokens, min: 1, max: 32768, default: 8, scale: log}",
                         "      T: {meaning: tokens, unit: tokens, min: 1, max: 1.0e12, default: 8, scale: log}"),
                        ("      with: {L: 2, T: 8, m: 16}", "      with: {L: 1, T: {device_memory: A100 40GB}, m: 1}"))
    assert _problems(wrong_unit) == ["specs[0].compute.with.T: expected a device's memory only for a variable in B, "
                                     "got {device_memory: A100 40GB} for one in 'tokens'"]
    for value, got in (("{device_memory: A100 40GB, extra: 1}", "got a mapping with keys device_memory, extra"),
                       ("{device: A100 40GB}", "got a mapping with keys device"),
                       ("true", "got true or false"), ("'eighty'", "got the text 'eighty'")):
        path = _entry(tmp_path, "bad-value", (SPEC, f"      with: {{L: 2, T: 8, m: {value}}}"))
        assert _problems(path) == [f"specs[0].compute.with.m: expected a number or {{device_memory: <device name>}}, "
                                   f"{got}"]
    with pytest.raises(ValueError, match="expected one of the devices"):
        device_memory("H100")


def test_a_slider_default_names_its_device_too(tmp_path):
    typed = _entry(tmp_path, "typed-default", (WIDE_M[0], WIDE_M[1].replace("default: 16", "default: 8.0e10")))
    (problem,) = _problems(typed)
    assert problem.startswith("science[0].variables.m.default: expected {device_memory: <device>} naming A100 80GB "
                              "or H100 80GB")
    named = _entry(tmp_path, "named-default", (WIDE_M[0], WIDE_M[1].replace("default: 16",
                                                                          "default: {device_memory: A100 80GB}")))
    (entry,), problems = content.validate_files([named])
    assert problems == [] and entry.science[0].variables["m"].default.device == "A100 80GB"


def test_device_memory_survives_copies_and_pickles():
    value = device_memory("H200 141GB")
    for clone in (copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert isinstance(clone, DeviceMemory) and clone == value and clone.device == "H200 141GB"


def test_no_entry_types_a_device_capacity_and_the_h100_spec_uses_the_reported_size():
    entries = content.load_all()
    serving = entries["serving"]
    spec = next(s for s in serving.specs if s.label.startswith("Llama-2-7B sequences"))
    reported = dantinox.DEVICE_PRESETS["H100 80GB"].memory_bytes
    assert spec.compute.with_["M"] == reported and spec.compute.with_["M"].device == "H100 80GB"
    assert content.spec_value(serving, spec) == "33 sequences"  # with a typed 8.0e10 it was 30
    named = [v for e in entries.values() for s in e.specs if s.compute for v in s.compute.with_.values()
             if isinstance(v, DeviceMemory)]
    assert {v.device for v in named} == {"H100 80GB", "H200 141GB"}


@pytest.mark.parametrize("url,accepted", [
    ("https://github.com/o/r/pull/12", False),
    ("https://github.com/o/r/pull/12.patch", False),
    ("https://github.com/o/r/pull/12/files", False),
    ("https://github.com/o/r/pull/12#discussion_r1", False),
    ("https://github.com/o/r/pull/12/commits/0123456789abcdef0123456789abcdef01234567", True),
    ("https://github.com/o/r/blob/0123456789abcdef0123456789abcdef01234567/model.py#L81", True),
    ("https://github.com/o/r/issues/12", True),
    ("https://gitlab.com/o/r/-/merge_requests/12", True),
])
def test_a_pull_request_is_cited_at_a_commit(tmp_path, url, accepted):
    path = _entry(tmp_path, "pr-link", (LINK, f"    appears_in: {url}"))
    problems = _problems(path)
    assert (problems == []) == accepted, problems
    if not accepted:
        assert problems[0].startswith("misconception[0].appears_in: expected a pull request at a commit")


def test_a_pull_request_that_fixed_the_belief_says_so_on_the_card(tmp_path):
    from widgets.card import ConceptCard

    url = "https://github.com/o/r/pull/12"
    path = _entry(tmp_path, "pr-fix", ("    appears_in: https://jax-ml.github.io/scaling-book/",
                                       f"    appears_in: {url}\n    shows: fix"))
    (entry,), problems = content.validate_files([path])
    assert problems == []
    html = ConceptCard(entry).sections["misconception"].value
    assert f"href='{url}'" in html and ">the fix of this belief</a>" in html and "where this belief appears" not in html
    wrong = _entry(tmp_path, "pr-shows", ("    appears_in: https://jax-ml.github.io/scaling-book/",
                                          f"    appears_in: {url}\n    shows: fixed"))
    assert _problems(wrong) == ["misconception[0].shows: expected 'belief' or 'fix', got the text 'fixed'"]
