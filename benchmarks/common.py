"""Helpers shared by the benchmark scripts (run them as `python benchmarks/<name>.py`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dantinox.accounting.roofline import best_of  # noqa: F401  (fastest of n timed calls after a compiling one)

ROOT = Path(__file__).resolve().parent.parent


# What each tree's process runs first: with `--one-core` (its first argument "1") it keeps to one core, set before
# JAX starts (whose thread pool takes the cores the process may run on), and `clock` is its CPU time, which other
# jobs on a shared machine disturb less than the wall clock; else `clock` is the wall clock. It imports os, sys
# and time for the code after it.
CLOCK = """
import os, sys, time
one_core = sys.argv.pop(1) == "1"
if one_core:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
clock = time.process_time if one_core else time.perf_counter
"""


def trees_arguments(description: str, repeats: int) -> argparse.ArgumentParser:
    """The options of a script that times an earlier commit against the working tree: the commit, --rounds,
    --repeats (default `repeats`) and --one-core."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("commit", help="the earlier commit (any name git rev-parse takes)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--one-core", action="store_true",
                    help="each process on one core, timed by its CPU time: what the code computes, less of what "
                         "other jobs on the machine take from it")
    return ap


def run_in_tree(tree: Path, code: str, one_core: bool, *args: str) -> dict:
    """`code` (after CLOCK) run by this venv's Python with `tree` first on its path: the JSON of its last line."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CLOCK + code, str(int(one_core)), *args], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{Path(sys.argv[0]).stem}: failed in {tree}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def commit_named(name: str) -> str:
    """The full hash of the commit `name` (anything git rev-parse takes); SystemExit where there is none."""
    rev = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout.strip()
    if not rev:
        raise SystemExit(f"commit: {name!r} is not a commit of this repository")
    return rev


def short_head() -> str:
    """This checkout's HEAD, abbreviated."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


@contextlib.contextmanager
def checked_out(rev: str) -> Iterator[Path]:
    """`rev` checked out into a temporary git worktree, removed at the end: its folder."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def in_turns(rounds: int, time_side: Callable[[str], dict]) -> tuple[dict[str, list[dict]], list[float]]:
    """`time_side("before")` and `time_side("after")` once a round, each first every other round (the second of
    a pair of processes measured slower in one run here), so that the machine's drift reaches both alike: each
    side's results, round by round, and the load average at the start of each round."""
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    loads = []
    for i in range(rounds):
        loads.append(os.getloadavg()[0])
        for side in ("before", "after")[::1 if i % 2 == 0 else -1]:
            runs[side].append(time_side(side))
    return runs, loads


def at_least_one(args, *names: str) -> None:
    """SystemExit, naming the option, where one of `names` of the parsed `args` is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected a whole number >= 1, got {getattr(args, name)}")


def side_by_side(runs: dict[str, list[dict]], fastest: Callable, first_column: str, digits: int) -> dict[str, dict]:
    """Per cell of `in_turns`'s runs: each side's rounds, median and fastest (`fastest`: max for a rate, min for a
    time) and after / before of the medians, printed as a markdown table (values to `digits` decimals)."""
    print(f"| {first_column} | before median | after median | after / before | before fastest | after fastest |")
    print("|---|---:|---:|---:|---:|---:|")
    table = {}
    for cell in runs["before"][0]:
        b, a = ([r[cell] for r in runs[side]] for side in ("before", "after"))
        row = dict(before_median=statistics.median(b), after_median=statistics.median(a), before_best=fastest(b),
                   after_best=fastest(a), before=b, after=a)
        row["ratio"] = row["after_median"] / row["before_median"]
        table[cell] = row
        b_median, a_median, b_best, a_best = (f"{row[key]:,.{digits}f}" for key in ("before_median", "after_median",
                                                                                    "before_best", "after_best"))
        print(f"| {cell} | {b_median} | {a_median} | {row['ratio']:.2f}× | {b_best} | {a_best} |")
    return table


def write_results(path: Path, **fields) -> None:
    """`fields` and the time (UTC) as JSON at `path` (under benchmarks/results, which git ignores)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **fields), indent=1))


def compare_trees(args: argparse.Namespace, code: str, child_args: list[str], unit: str, fastest: Callable,
                  first_column: str, digits: int, out: Path, **fields) -> None:
    """`args.commit` (before) against the working tree (after), `code` run in each with `child_args` (its JSON
    line a dict of cells), `args.rounds` rounds taking turns: a table of `unit` (`side_by_side`), headed by the
    commits and the load average, and the results with `fields` written to `out`."""
    rev, head = commit_named(args.commit), short_head()
    with checked_out(rev) as old:
        runs, loads = in_turns(args.rounds, lambda side: run_in_tree(old if side == "before" else ROOT, code,
                                                                     args.one_core, *child_args))
    print(f"{unit}, {rev[:7]} (before) against the working tree at {head} (after), {args.rounds} rounds taking "
          f"turns, load average {min(loads):.1f}-{max(loads):.1f}:\n")
    table = side_by_side(runs, fastest, first_column, digits)
    write_results(out, before=rev, after=head, rounds=args.rounds, repeats=args.repeats, one_core=args.one_core,
                  load=loads, cells=table, **fields)
