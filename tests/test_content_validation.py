"""The validator: each deliberately broken entry gives exactly its one-line message, from the API and the command."""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import content
from content import entry_checks, expr, yamlio
from content.yamlio import MAX_BYTES, YamlProblem, read_yaml

FIXTURES = Path(__file__).parent / "content_fixtures"
BASE = FIXTURES / "base" / "fixture-base.yaml"
ALLOWED = "numbers, declared variable names, + - * / // % **, parentheses and min, max, ceil, floor, log2, sqrt"

# fixture (relative to FIXTURES) -> the one line it must produce, after "<file>:"
EXPECTED = {
    "alias-bomb.yaml": "25: yaml: expected plain data without anchors, got anchor &lol",
    "answer-out-of-range.yaml": "53: checks[1].answer: expected an option index from 0 to 3, got 4",
    "belief-out-of-range.yaml": "54: checks[1].beliefs[2]: expected an index into this entry's misconception list "
                                "(0 to 0), got 3",
    "bad-check-kind.yaml": "50: checks[1]: expected kind 'choice', 'numeric', got 'essay'",
    "bad-placeholder.yaml": "43: checks[0].question: expected placeholders naming params (L, T, m), got {dtype}",
    "bad-related.yaml": "27: related[0]: expected the id of an existing entry such as 'kv-cache', got 'kv-cach'",
    "cycle/cycle-a.yaml": "28: prerequisites[0]: expected no prerequisite cycle, got cycle-a -> cycle-b -> cycle-a",
    "digit-in-spec.yaml": "19: specs[1].value: expected words without digits (a number must come from `compute`), "
                          "got 'about 256 bytes'",
    "duplicate-key.yaml": "6: name: expected each key once, got a second 'name' (first on line 4)",
    "exponent-bomb.yaml": "63: science[0].compute: expected an exponent of at most 64, got 387420489",
    "history-before-arxiv.yaml": "73: history[0].year: expected a year no earlier than the first arXiv version of "
                                 "its source (2024, from the identifier 2403.02310), got 2023: credit the earlier "
                                 "work with its own item and source",
    "id-mismatch.yaml": "2: id: expected the file name without .yaml ('id-mismatch'), got 'some-other-id'",
    "loose-tolerance.yaml": "47: checks[0].tolerance: expected a tolerance that refuses the answer rounded to 2 "
                            "significant figures (260 is 1.6% off 256), got 0.05",
    "mirror-source.yaml": "31: sources[0].url: expected the original source, not a page on mintlify.com (generated "
                          "documentation sites built from other projects' repositories), got "
                          "'https://www.mintlify.com/vllm-project/vllm/concepts/paged-attention'",
    "misconception-no-correction.yaml": "37: misconception[0].corrected_by: expected the URL of a primary source "
                                        "that corrects the belief (paper, official docs, config or code), got nothing",
    "misconception-same-source.yaml": "40: misconception[0].corrected_by: expected a primary source that corrects "
                                      "the belief, not the page where it appears (appears_in), got the same URL "
                                      "'https://jax-ml.github.io/scaling-book'",
    "missing-science.yaml": "44: checks[0].science: expected the title of one of this entry's science items "
                            "('Cache size'), got 'Cache bytes'",
    "no-numeric-check.yaml": "41: checks: expected at least one numeric check (kind: numeric), got only choice checks",
    "no-precision.yaml": "42: checks[0].precision: expected the significant figures the question grades at "
                         "(1 to 6), got nothing",
    "non-http-url.yaml": "31: sources[0].url: expected an http(s) URL, got 'ftp://example.org/inference.pdf'",
    "precision-in-question.yaml": "43: checks[0].question: expected the precision only in `precision` (the "
                                  "rendered question states it), got 'to the nearest' in the question text",
    "pull-request-appears-in.yaml": "39: misconception[0].appears_in: expected a pull request at a commit "
                                    "(.../pull/N/commits/<sha>) or the file before the fix (.../blob/<sha>/<path>#L"
                                    "<line>), or `shows: fix` when the link is the fix of this belief, got "
                                    "'https://github.com/example-org/example-repo/pull/123'",
    "python-tag.yaml": "25: yaml: expected valid YAML, got: could not determine a constructor for the tag "
                       "'tag:yaml.org,2002:python/object/apply:os.system'",
    "relative-timing.yaml": "7: description: expected the dates and places of the versions being ordered (which "
                            "came first depends on the versions counted), got a relative time 'days later'",
    "tight-tolerance.yaml": "47: checks[0].tolerance: expected a tolerance that accepts the answer rounded as "
                            "the question asks (260 is 1.6% off 256), got 0.01",
    "typed-capacity.yaml": "15: specs[0].compute.with.m: expected {device_memory: <device>} naming A100 80GB or "
                           "H100 80GB (capacities come from content/devices.yaml), got the typed number "
                           "80,000,000,000: the A100 80GB's rated capacity in GB; the H100 80GB's rated capacity in GB",
    "undeclared-variable.yaml": "63: science[0].compute: expected only declared variables (L, T, m); "
                                "got undeclared name 'K'",
    "unknown-key.yaml": "8: mechansim: expected the field 'mechanism', got misspelled key 'mechansim'",
    "unknown-device.yaml": "45: checks[0].params.m: expected one of the devices in content/devices.yaml (A100 40GB, "
                           "A100 80GB, H100 80GB, H200 141GB), got 'H300 200GB'",
    "unsafe-attribute.yaml": f"63: science[0].compute: expected only {ALLOWED}; got attribute access '.__class__'",
    "unsafe-import.yaml": f"63: science[0].compute: expected only {ALLOWED}; "
                          "got a call to '__import__(\"os\").system'",
    "unused-variable.yaml": "68: science[0].variables.H: expected every declared variable to appear in compute, "
                            "got unused 'H'",
    "wrong-type.yaml": "58: checks[2].answer: expected a whole number, got the text 'yes'",
    "yaml-syntax.yaml": "33: yaml: expected valid YAML, got: mapping values are not allowed here",
}
# which files each case is checked with (the cycle needs both of its halves)
INPUTS = {name: [FIXTURES / name] for name in EXPECTED}
INPUTS["cycle/cycle-a.yaml"] = [FIXTURES / "cycle"]


def test_every_fixture_has_an_expected_message():
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.yaml")
               if not p.name.startswith("range-")} - {"base/fixture-base.yaml", "cycle/cycle-b.yaml"}
    assert on_disk == set(EXPECTED)  # range-*.yaml: tests/test_content_ranges.py


def test_the_base_fixture_is_valid():
    entries, problems = content.validate_files([BASE])
    assert problems == [] and [e.id for e in entries] == ["fixture-base"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_fixture_gives_exactly_its_message(name):
    entries, problems = content.validate_files(INPUTS[name])
    assert [str(p) for p in problems] == [f"{FIXTURES / name}:{EXPECTED[name]}"]
    assert [e.id for e in entries if e.id == Path(name).stem] == []


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"bad-related.yaml", "cycle/cycle-a.yaml"}))
def test_load_entry_raises_the_same_one_line_message(name, tmp_path):
    shutil.copytree(content.CONTENT_DIR, tmp_path, dirs_exist_ok=True)
    target = tmp_path / Path(name).name
    shutil.copy(FIXTURES / name, target)
    with pytest.raises(content.ContentError) as err:
        content.load_entry(target.stem, root=tmp_path)
    assert str(err.value) == f"{target}:{EXPECTED[name]}"
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError)
    with pytest.raises(content.ContentError):
        content.load_all(tmp_path)


def test_a_file_is_checked_again_only_when_its_bytes_change(tmp_path, monkeypatch):
    """content.validate keeps what it read by file name and bytes: a second read (another folder, another label)
    costs no check, its problems name the file read, each reader gets its own copy; edited bytes are checked."""
    from content import validate

    checked, check = [], validate._check_file
    monkeypatch.setattr(validate, "_READ", {})
    monkeypatch.setattr(validate, "_check_file", lambda path, label: checked.append(path.stem) or check(path, label))
    first, second = tmp_path / "a" / "digit-in-spec.yaml", tmp_path / "b" / "digit-in-spec.yaml"
    for target in (first, second):
        target.parent.mkdir()
        shutil.copy(FIXTURES / "digit-in-spec.yaml", target)
    problems = [[str(p) for p in validate.read_entry(path).problems] for path in (first, second, first)]
    assert checked == ["digit-in-spec"]
    assert problems == [[f"{path}:{EXPECTED['digit-in-spec.yaml']}"] for path in (first, second, first)]
    base = tmp_path / "fixture-base.yaml"
    shutil.copy(BASE, base)
    one, two = validate.read_entry(base), validate.read_entry(base)
    one.entry.name = "changed by its reader"
    assert two.entry.name != one.entry.name == "changed by its reader"
    assert checked == ["digit-in-spec", "fixture-base"]
    base.write_text(base.read_text().replace("fixture-base", "fixture-bass", 1))
    assert [str(p) for p in validate.read_entry(base).problems] == [
        f"{base}:2: id: expected the file name without .yaml ('fixture-base'), got 'fixture-bass'"]
    assert checked == ["digit-in-spec", "fixture-base", "fixture-base"]


def test_load_all_reports_a_cycle_and_a_bad_related_id(tmp_path):
    shutil.copytree(content.CONTENT_DIR, tmp_path, dirs_exist_ok=True)
    for name in ("cycle/cycle-a.yaml", "cycle/cycle-b.yaml", "bad-related.yaml"):
        shutil.copy(FIXTURES / name, tmp_path)
    with pytest.raises(content.ContentError) as err:
        content.load_all(tmp_path)
    assert [str(p) for p in err.value.problems] == [
        f"{tmp_path / 'bad-related.yaml'}:{EXPECTED['bad-related.yaml']}",
        f"{tmp_path / 'cycle-a.yaml'}:{EXPECTED['cycle/cycle-a.yaml']}",
    ]
    assert str(err.value).endswith("(and 1 more problem(s))")


def _dantinox(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("dantinox")
    return subprocess.run([str(script), "content", "check", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_command_prints_one_line_per_broken_file_and_exits_1():
    paths = sorted(str(p) for name, inputs in INPUTS.items() for p in inputs)
    done = _dantinox(*paths)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr and done.stderr == ""
    assert done.stdout.splitlines() == sorted(f"{FIXTURES / name}:{line}" for name, line in EXPECTED.items())


def test_command_on_one_file_and_with_its_default_directory():
    done = _dantinox(str(FIXTURES / "unknown-key.yaml"))
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout == f"{FIXTURES / 'unknown-key.yaml'}:{EXPECTED['unknown-key.yaml']}\n"
    done = _dantinox(cwd=content.CONTENT_DIR.parent)  # no path: content/
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"OK: {len(content.load_all())} entries valid (")


@pytest.mark.parametrize("url,first", [
    ("https://arxiv.org/abs/2308.16369", (2023, "2308.16369")),
    ("https://arxiv.org/pdf/2403.02310v2", (2024, "2403.02310")),
    ("https://www.arxiv.org/abs/1911.02150", (2019, "1911.02150")),
    ("https://arxiv.org/abs/cs/0501001", None),  # old-style identifiers carry no date in this form
    ("https://arxiv.org/abs/2413.00001", None),  # no thirteenth month
    ("https://example.org/abs/2403.02310", None),
])
def test_arxiv_first_year(url, first):
    assert entry_checks.arxiv_first_year(url) == first


def test_a_history_item_may_carry_a_later_venue_year_and_relative_words_inside_words_pass(tmp_path):
    later = _variant(tmp_path, "venue-year", "source: https://jax-ml.github.io/scaling-book/inference/\nlearning",
                     "source: https://arxiv.org/abs/2211.17192\nlearning")  # arXiv 2022, the venue's 2025 kept
    worded = _variant(tmp_path, "worded", "description: It exists", "description: Holidays later differ; it exists")
    entries, problems = content.validate_files([later, worded])
    assert problems == [] and len(entries) == 2


def test_missing_path_and_empty_directory(tmp_path):
    _, problems = content.validate_files([tmp_path / "no-such-file.yaml", tmp_path])
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'no-such-file.yaml'}: path: expected an entry file or a directory, got nothing there",
        f"{tmp_path}: path: expected a directory with .yaml entry files, got none",
    ]


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = BASE.read_text().replace("id: fixture-base", f"id: {name}", 1)
    assert old in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_oversized_file_is_rejected_before_parsing(tmp_path):
    path = tmp_path / "oversized.yaml"
    path.write_text(BASE.read_text().replace("id: fixture-base", "id: oversized") + "#" * MAX_BYTES)
    _, problems = content.validate_files([path])
    size_kib = round(path.stat().st_size / 1024)
    assert [str(p) for p in problems] == [f"{path}: file: expected at most 256 KiB, got {size_kib} KiB"]


def test_billion_laughs_and_deep_nesting_are_refused(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    bomb.write_text("\n".join(rows) + "\n")
    _, problems = content.validate_files([bomb])
    assert [str(p) for p in problems] == [f"{bomb}:1: yaml: expected plain data without anchors, got anchor &a"]
    deep = tmp_path / "deep.yaml"
    deep.write_text("id: " + "[" * 5000 + "]" * 5000 + "\n")
    _, problems = content.validate_files([deep])
    assert [str(p) for p in problems] == [f"{deep}:1: yaml: expected at most 32 levels of nesting"]


def test_script_text_is_loaded_as_plain_data(tmp_path):
    text = '<script>alert("x")</script> & <b>bold</b>'
    path = _variant(tmp_path, "html-text", "description: It exists", f"description: '{text} It exists")
    path.write_text(path.read_text().replace("valid entry in exactly one place.", "valid entry in exactly one place.'"))
    entries, problems = content.validate_files([path])
    assert problems == []
    assert entries[0].description.startswith(text)


def test_nothing_in_content_is_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _variant(tmp_path, "writes-file", "compute: L * T * m", "compute: open('marker', 'w') * L * T * m")
    _, problems = content.validate_files([path])
    assert len(problems) == 1 and "got a call to 'open'" in str(problems[0])
    assert not (tmp_path / "marker").exists()


def test_non_utf8_and_non_mapping_files(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"id: caf\xe9\n")
    listing = tmp_path / "listing.yaml"
    listing.write_text("- kv-cache\n- attention\n")
    _, problems = content.validate_files([latin, listing])
    assert [str(p) for p in problems] == [
        f"{latin}: file: expected UTF-8 text, got byte 0xe9 at offset 7",
        f"{listing}:1: entry: expected a mapping of entry fields, got a list",
    ]


@pytest.mark.parametrize("source,message", [
    ("9 ** 9 ** 9", "expected an exponent of at most 64, got 387420489"),
    ("L ** 65", "expected an exponent of at most 64, got 65"),
    ("(L ** 64) ** 64 ** 2", "expected an exponent of at most 64, got 4096"),
    ("L / 0", "expected a non-zero divisor for '/', got 0"),
    ("L.real", "got attribute access '.real'"),
    ("L[0]", "got indexing [...]"),
    ("'text'", "got the constant 'text'"),
    ("True + L", "got the constant True"),
    ("1j * L", "got the constant 1j"),
    ("L if L else 0", "got IfExp"),
    ("(lambda: 1)()", "got a call to 'lambda: 1'"),
    ("[x for x in L]", "got ListComp"),
    ("L < 2", "got a comparison or boolean operator"),
    ("pow(L, 2)", "got a call to 'pow'"),
    ("min(L)", "min: expected two or more argument(s), got 1"),
    ("ceil(x=L)", "ceil: expected plain positional arguments"),
    ("__builtins__", "got undeclared name '__builtins__'"),
    ("L +", "expected an arithmetic expression, got a syntax error"),
    ("log2(L - 3)", "log2: expected a positive argument, got 0"),
    ("L * " * 200 + "L", "expected at most 500 characters"),
])
def test_safe_evaluator_refuses(source, message):
    with pytest.raises(expr.ExpressionError) as err:
        expr.evaluate(source, {"L": 3})
    assert message in str(err.value)


def test_safe_evaluator_computes_what_it_allows():
    values = {"L": 12, "T": 7, "W": 4}
    assert expr.evaluate("L * 2 + -T // 2 % 5 - +W ** 2", values) == 12 * 2 + -7 // 2 % 5 - 4**2
    assert expr.evaluate("max(min(T, W), 1) / sqrt(16) + ceil(T / W) + floor(T / W) + log2(8)", values) == \
        min(7, 4) / 4 + 2 + 1 + 3
    assert math.isclose(expr.evaluate("1e3 * L", values), 12000)


def test_api_errors_are_one_line_value_errors():
    entry = content.load_entry("kv-cache")
    cases = [
        (lambda: content.evaluate(entry, "KV cache size", L=1), "variables: expected a value for every variable"),
        (lambda: content.evaluate(entry, "No such item"), "science: expected one of 'KV cache size'"),
        (lambda: content.evaluate(entry, 7), "science: expected an index from 0 to 1, got 7"),
        (lambda: content.check_answer(entry, 2), "check_index: expected a numeric check, but checks[2]"),
        (lambda: content.check_answer(entry, 99), "check_index: expected 0 to 4 for 'kv-cache', got 99"),
        (lambda: content.check_answer(entry, 0, {"X": 1}), "params: expected some of L, B, T, H_kv, d_h, bytes"),
        (lambda: content.check_answer(entry, 0, {"T": "many"}), "params: T: expected a finite number"),
        (lambda: content.render_question(entry, 2, {"T": 1}), "params: checks[2] of 'kv-cache' is a choice check"),
        (lambda: content.is_correct(entry, 0, "six"), "response: expected a finite number for checks[0]"),
        (lambda: content.load_entry("../etc/passwd"), "id: expected an entry id like 'kv-cache'"),
        (lambda: content.load_entry("no-such-entry"), "id: expected one of the entries in"),
    ]
    for call, start in cases:
        with pytest.raises(content.ContentError) as err:
            call()
        assert start in str(err.value) and "\n" not in str(err.value)


def _mangled(path: Path, seed: int, junk: list[str], count: int = 150):
    """Write `count` copies of the base fixture, each with 1-3 lines hit by junk, an indent or a deletion, to
    `path`, yielding each one's text."""
    rng = random.Random(seed)
    base = BASE.read_text().replace("id: fixture-base", "id: mangled").splitlines()
    for _ in range(count):
        lines = list(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            k = rng.randrange(len(lines[i]) + 1)
            lines[i] = rng.choice([lines[i][:k] + rng.choice(junk) + lines[i][k:], " " + lines[i], ""])
        path.write_text("\n".join(lines))
        yield "\n".join(lines)


def test_mangled_entries_never_raise_and_every_problem_is_one_line(tmp_path):
    junk = ["{", "]", ":", "&a", "*a", "!!python/none", '"', "\t", "- ", "|", "{L}", "1e999", ".nan", "~", "\x00", "é"]
    path = tmp_path / "mangled.yaml"
    for _ in _mangled(path, 0, junk):
        entries, problems = content.validate_files([path])
        assert entries or problems
        assert all("\n" not in str(p) and str(p).startswith(f"{path}") for p in problems)


def _read_both(path: Path):
    """read_yaml's answer (data and lines, or the problem) through libyaml and through pure-Python PyYAML."""
    out = []
    for libyaml in (True, False):
        try:
            out.append(read_yaml(path, libyaml=libyaml))
        except YamlProblem as err:
            out.append((err.field, err.message, err.line))
    return out


def test_libyaml_and_pure_python_reading_give_the_same_data_lines_and_problems(tmp_path):
    assert yamlio.CParser is not None, "PyYAML without libyaml: the entries are read four times slower"
    files = sorted(content.CONTENT_DIR.glob("*.yaml")) + sorted(FIXTURES.rglob("*.yaml"))
    for path in files:
        fast, pure = _read_both(path)
        assert fast == pure, path
    junk = ["{", "]", ":", "&a", "*a", "!!python/none", '"', "\t", "- ", "|", "1e999", "\x00", "\x85", "\ufeff", "%"]
    path = tmp_path / "mangled.yaml"
    for text in _mangled(path, 1, junk):  # mangled as in the test above, with more junk
        fast, pure = _read_both(path)
        assert fast == pure, text
