"""Readings of the decode panel's runs, free of widgets: what a run measured, when two runs may be compared,
the with/without-cache step ratio over repeats, and the time left of a decode in progress.

A decode step makes one token for each of the B sequences. The ratio is formed only between runs of
identical settings (model, cache dtype, B, prompt length, new tokens), with its spread over every repeat.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import dantinox
from widgets._html import esc


def describe(cfg: dantinox.ModelConfig) -> str:
    """'4-layer GQA K=2' and the like: how the panel names a model."""
    kind = "MLA" if cfg.attention == "latent" else f"{cfg.variant.upper()} K={cfg.n_kv_heads}"
    return f"{cfg.n_layers}-layer d={cfg.d_model} {kind}"


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """What a decode's step times depend on: runs are compared only when these are equal."""

    cfg: dantinox.ModelConfig
    batch: int
    prompt_tokens: int
    new_tokens: int

    def differences(self, other: DecodeSettings) -> list[str]:
        """'B=1 vs B=2' and the like, one per setting that differs."""
        def named(s: DecodeSettings) -> dict[str, str]:
            return {"model": describe(s.cfg), "cache": s.cfg.cache_dtype, "B": str(s.batch),
                    "prompt": f"{s.prompt_tokens} tokens", "new tokens": str(s.new_tokens)}
        a, b = named(self), named(other)
        return [f"{k}={a[k]} vs {k}={b[k]}" if k in ("B", "cache") else f"{k} {a[k]} vs {b[k]}"
                for k in a if a[k] != b[k]]


@dataclasses.dataclass(frozen=True)
class StepRatio:
    """One decode step without the cache over one with it, at the same tokens held, over repeated runs."""

    held: int  # tokens held at the compared step (the last one both kinds of run timed)
    batch: int
    cache_ms: tuple[float, ...]  # measured: one decode step with the cache, one value per run
    no_cache_ms: tuple[float, ...]  # measured: the same step recomputing the prefix, one value per run

    @property
    def ratio(self) -> float:
        """Median without over median with."""
        return float(np.median(self.no_cache_ms) / np.median(self.cache_ms))

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and highest ratio any pair of these runs gives."""
        return min(self.no_cache_ms) / max(self.cache_ms), max(self.no_cache_ms) / min(self.cache_ms)


def step_ratio(runs: list[DecodeRun], settings: DecodeSettings) -> StepRatio | None:
    """The with/without ratio over every run made with `settings`; None without one of each to compare."""
    same = [r for r in runs if r.settings == settings]
    kinds = [[r for r in same if r.use_cache], [r for r in same if not r.use_cache]]
    if not all(kinds):
        return None
    timed = [{r.held[i]: r.seconds[i] / r.steps[i] * 1e3 for i in r.steady()} for r in same]
    common = set.intersection(*(set(t) for t in timed))
    if not common:
        return None
    held = max(common)
    ms = {id(r): t[held] for r, t in zip(same, timed, strict=True)}
    return StepRatio(held, settings.batch, tuple(ms[id(r)] for r in kinds[0]), tuple(ms[id(r)] for r in kinds[1]))


@dataclasses.dataclass
class DecodeRun:
    """What one click produced, chunk by chunk: tokens, model time, and the cache bytes after each chunk."""

    use_cache: bool
    batch: int
    prompt_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)  # sequence 0
    held: list[int] = dataclasses.field(default_factory=list)  # tokens held after each chunk
    steps: list[int] = dataclasses.field(default_factory=list)  # decode steps in each chunk
    seconds: list[float] = dataclasses.field(default_factory=list)  # measured: the chunk's compiled calls
    compiled: list[bool] = dataclasses.field(default_factory=list)  # the chunk compiled a program
    filled_bytes: list[int] = dataclasses.field(default_factory=list)  # measured: written slots × bytes/slot
    allocated_bytes: list[int] = dataclasses.field(default_factory=list)  # measured: the cache as allocated
    bytes_per_token: int | None = None  # measured: allocated bytes / cache slots / B, after the last chunk
    wall_seconds: float = 0.0  # measured: the whole loop, drawing included
    stopped: bool = False
    finished: bool = False  # the loop has ended (an unfinished run may still time its first compiled step)
    settings: DecodeSettings | None = None  # what the step times depend on

    def steady(self) -> list[int]:
        """Indices of the chunks that compiled nothing."""
        return [i for i, c in enumerate(self.compiled) if not c]

    def ms_per_token(self) -> list[float]:
        """Milliseconds per decode step (one token for each of the B sequences), steady chunks only."""
        return [self.seconds[i] / self.steps[i] * 1e3 for i in self.steady()]

    @property
    def tokens_per_s(self) -> float:
        """Model time: tokens over all sequences per second of compiled decoding, compiling chunks left out."""
        steady = self.steady()
        seconds = sum(self.seconds[i] for i in steady)
        return self.batch * sum(self.steps[i] for i in steady) / seconds if seconds > 0 else float("nan")

    @property
    def wall_tokens_per_s(self) -> float:
        """What the learner waits for: all tokens over the wall time of the loop, drawing and compiling included."""
        return self.batch * len(self.tokens) / self.wall_seconds if self.wall_seconds > 0 else float("nan")


def seconds_left(run: DecodeRun, new_tokens: int) -> float | None:
    """Estimated seconds to finish, from the steady chunks so far (None before one): with the cache a step
    costs the same at every length; without it, a step recomputes the prefix, so its cost grows with it."""
    steady = run.steady()
    if not steady:
        return None
    done = len(run.tokens)
    end = run.prompt_tokens + new_tokens
    held_now = run.held[-1] if run.held else run.prompt_tokens
    steps_left = max(0, new_tokens - done)
    if run.use_cache:
        per_step = sum(run.seconds[i] for i in steady) / sum(run.steps[i] for i in steady)
        return per_step * steps_left
    per_token_held = sum(run.seconds[i] for i in steady) / sum(run.steps[i] * run.held[i] for i in steady)
    return per_token_held * sum(range(held_now + 1, min(end, held_now + steps_left) + 1))


def progress_text(run: DecodeRun, new_tokens: int) -> str:
    """'decoding without the cache: 40 of 243 tokens; about 12 s left (estimate from the chunks so far)'."""
    kind = "with the cache" if run.use_cache else "without the cache (every step recomputes the prefix)"
    left = seconds_left(run, new_tokens)
    eta = ("compiling the decode step first" if left is None else
           f"about {left:,.0f} s left (estimated from the chunks so far)")
    return (f"<div style='color:#555'>decoding {kind}: {len(run.tokens)} of {new_tokens} tokens × B={run.batch}; "
            f"{esc(eta)}</div>")
