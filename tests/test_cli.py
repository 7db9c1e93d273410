"""The `dantinox` command's guard rails: runs are never overwritten by accident, bad input is one line, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dantinox_labs import shipped
from dantinox_labs.cli import main


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("the cache keeps every key and value so none is computed twice. " * 20)
    return path


def _one_line_error(capsys, expected: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.strip() == expected


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_train_refuses_to_overwrite_a_run_without_the_flag(tmp_path, corpus, capsys):
    run = tmp_path / "tiny"
    shutil.copytree(shipped.run("tiny"), run)  # a copy: a broken check must not cost the shipped run
    before = _snapshot(run)
    assert main(["train", "--run_dir", str(run), "--steps", "1", "--corpus", str(corpus)]) == 2
    _one_line_error(capsys, f"dantinox train: error: --run_dir: {run} already holds a run; choose a new folder, "
                            "or pass --overwrite to replace it")
    assert _snapshot(run) == before


def test_train_with_overwrite_replaces_the_run(tmp_path, corpus, capsys):
    run = tmp_path / "r"
    args = ["train", "--run_dir", str(run), "--preset", "test", "--steps", "1", "--corpus", str(corpus),
            "--seq_len", "16", "--batch_size", "2"]
    assert main(args) == 0
    first = (run / "weights.safetensors").read_bytes()
    assert main([*args, "--seed", "1"]) == 2  # refused: the first run is still there
    assert main([*args, "--seed", "1", "--overwrite"]) == 0
    assert (run / "weights.safetensors").read_bytes() != first


@pytest.mark.parametrize("where", ["file", "file/run"])
def test_a_run_dir_in_the_place_of_a_file_is_refused_before_training(tmp_path, corpus, capsys, where):
    (tmp_path / "file").write_text("notes")
    assert main(["train", "--run_dir", str(tmp_path / where), "--steps", "1", "--corpus", str(corpus)]) == 2
    _one_line_error(capsys, f"dantinox train: error: --run_dir: {tmp_path / 'file'} is a file; expected a folder "
                            "for the new run")
    assert (tmp_path / "file").read_text() == "notes"


def test_local_per_global_needs_a_sliding_window(tmp_path, corpus, capsys):
    assert main(["train", "--run_dir", str(tmp_path / "r"), "--local_per_global", "1", "--corpus", str(corpus)]) == 2
    _one_line_error(capsys, "dantinox train: error: --local_per_global 1: applies only with --sliding_window W")
    assert not (tmp_path / "r").exists()


def test_train_help_shows_defaults_and_presets(capsys):
    from dantinox import PRESETS

    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"model size: {', '.join(sorted(PRESETS))} (default: tiny)" in text
    for shown in ("(default: 600)", "(default: 16)", "(default: 128)", "(default: autoregressive)"):
        assert shown in text


def test_usage_and_value_errors_both_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        main(["train"])  # --run_dir missing: argparse's usage error
    assert usage.value.code == 2
    capsys.readouterr()
    assert main(["train", "--run_dir", str(tmp_path / "r"), "--corpus", str(tmp_path / "none.txt")]) == 2
    _one_line_error(capsys, f"dantinox train: error: --corpus: {tmp_path / 'none.txt'} is not a file")


def test_answers_export_names_an_unknown_entry(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(tmp_path / "answers.sqlite"))
    assert main(["answers", "export", "--entry", "no-such-entry"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--entry: expected one of the entry ids (attention, " in err
    assert err.strip().endswith("got 'no-such-entry'")
