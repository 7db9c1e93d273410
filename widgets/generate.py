"""Real decoding with the lab's settings: the cache filling up token by token, and the same run without it.

    panel = GeneratePanel(lab)
    panel.run(use_cache=True, wait=True)     # what the first button does (it runs in a thread)
    panel.runs["cache"].tokens_per_s

Decoding uses `dantinox.stream`, the same compiled step as `dantinox.generate`. The model is built once
per config and kept, so clicking again (or changing T) never recompiles; a new batch size or prompt length
compiles the step once for that shape. Weights come from the trained run in `runs/tiny` when its config
matches the lab's; otherwise they are random and the panel says so.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import jax
import jax.numpy as jnp
import numpy as np
import plotly.graph_objects as go
from flax import nnx
from plotly.subplots import make_subplots

import dantinox
from dantinox import tokenizer
from widgets._html import badge, error_box, esc, note_box
from widgets.cache_lab import CacheLab

DEFAULT_RUN_DIR = Path(__file__).resolve().parents[1] / "runs" / "tiny"
MIB = 2**20


@dataclasses.dataclass
class DecodeRun:
    """What one click produced: tokens, per-token wall time, and the cache bytes after each token."""

    use_cache: bool
    batch: int
    prompt_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)  # sequence 0
    seconds: list[float] = dataclasses.field(default_factory=list)  # wall time of each new token
    held: list[int] = dataclasses.field(default_factory=list)  # tokens held after each new token
    filled_bytes: list[int] = dataclasses.field(default_factory=list)  # measured: written slots × bytes/slot
    allocated_bytes: int = 0  # measured: the whole static cache
    stopped: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Tokens produced per second over all sequences, leaving out the first (it may include compiling)."""
        steady = self.seconds[1:]
        return self.batch * len(steady) / sum(steady) if steady and sum(steady) > 0 else float("nan")


def filled_slots(caches: tuple) -> int:
    """Measured from the cache itself: slots of layer 0, sequence 0 whose stored vector is not all zero."""
    first = jax.tree_util.tree_leaves(caches)[0]
    if first.ndim == 4:  # [B, K, S, H]
        written = jnp.any(first[0] != 0, axis=(0, 2))
    else:  # [B, S, C + R]
        written = jnp.any(first[0] != 0, axis=-1)
    return int(jnp.sum(written))


class GeneratePanel(widgets.VBox):
    """Two buttons: decode with the KV cache (bytes streamed as they fill) and without it (recompute)."""

    def __init__(self, lab: CacheLab, *, run_dir: str | Path = DEFAULT_RUN_DIR, prompt: str = "The KV cache",
                 new_tokens: int | None = None, budget_bytes: int | None = None):
        self.lab = lab
        self.run_dir = Path(run_dir)
        self.budget_bytes = lab.budget_bytes if budget_bytes is None else budget_bytes
        self._models: dict[dantinox.ModelConfig, tuple[dantinox.Transformer, str]] = {}
        self._trained: Any = None  # (cfg, model) of run_dir once loaded, or the reason it is not used
        self._thread: threading.Thread | None = None
        self._end = 1
        self._stop = threading.Event()
        self.runs: dict[str, DecodeRun] = {}
        self.error = ""
        self.prompt = widgets.Text(value=prompt, description="prompt", layout=widgets.Layout(width="520px"))
        longest = lab.config().max_context - 1
        if new_tokens is None:  # long enough for the no-cache cost to climb, short enough to wait for
            new_tokens = min(160, longest // 2)
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or not 1 <= new_tokens <= longest:
            raise ValueError(f"new_tokens: expected an integer in [1, {longest}] for preset "
                             f"{lab.preset.value!r}, got {new_tokens!r}")
        self.new_tokens = widgets.IntSlider(value=new_tokens, min=1, max=longest, description="new tokens",
                                            layout=widgets.Layout(width="520px"))
        self.cached_button = widgets.Button(description="decode with KV cache", button_style="primary",
                                            icon="play", layout=widgets.Layout(width="200px"))
        self.uncached_button = widgets.Button(description="decode without cache", icon="play",
                                              layout=widgets.Layout(width="200px"))
        self.stop_button = widgets.Button(description="stop", icon="stop", disabled=True,
                                          layout=widgets.Layout(width="90px"))
        self.status = widgets.HTML()
        self.text = widgets.HTML()
        self.stats = widgets.HTML()
        self.figure = go.FigureWidget(make_subplots(
            rows=1, cols=2, subplot_titles=("cache bytes held vs tokens (measured)",
                                            "time per new token (measured)")))
        self.figure.update_layout(height=380, width=900, margin=dict(l=60, r=20, t=60, b=50),
                                  legend=dict(orientation="h", y=-0.25))
        self.figure.update_xaxes(title_text="tokens held (prompt + generated)")
        self.figure.update_yaxes(title_text="MiB", row=1, col=1)
        self.figure.update_yaxes(title_text="ms (first token, which may compile, left out)", row=1, col=2)
        self.cached_button.on_click(lambda _: self.run(use_cache=True))
        self.uncached_button.on_click(lambda _: self.run(use_cache=False))
        self.stop_button.on_click(lambda _: self._stop.set())
        buttons = widgets.HBox([self.cached_button, self.uncached_button, self.stop_button])
        super().__init__([self.prompt, self.new_tokens, buttons, self.status, self.stats, self.text, self.figure])
        lab.observe(self._fit_to_lab, names="reading")
        self._fit_to_lab(None)

    def _fit_to_lab(self, _change) -> None:
        """The new-token slider spans the preset's context (the prompt's share is checked on click)."""
        if self.lab.reading is not None:
            self.new_tokens.max = self.lab.reading.cfg.max_context - 1

    # Model ----------------------------------------------------------------------------------------
    def _trained_run(self) -> tuple[dantinox.ModelConfig, dantinox.Transformer] | None:
        """The run in run_dir, loaded once; None when there is none or it cannot be read (said on screen)."""
        if self._trained is None:
            if not self.run_dir.is_dir():
                self._trained = f"no trained run at {self.run_dir}"
            else:
                try:
                    from dantinox.rundir import load_run

                    self._trained = load_run(self.run_dir)
                except ValueError as err:
                    self._trained = f"the run at {self.run_dir} was not loaded: {err}"
        return self._trained if isinstance(self._trained, tuple) else None

    def model_for(self, cfg: dantinox.ModelConfig) -> tuple[dantinox.Transformer, str]:
        """The model for a config (built once, then kept) and a line saying where its weights come from."""
        if cfg not in self._models:
            trained = self._trained_run()
            model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
            if trained is not None and trained[0].replace(cache_dtype=cfg.cache_dtype) == cfg:
                nnx.update(model, nnx.state(trained[1], nnx.Param))  # weights do not depend on the cache dtype
                where = f"trained weights from {self.run_dir.name}"
            else:
                why = self._trained if isinstance(self._trained, str) else (
                    f"{self.run_dir.name} holds a {trained[0].n_layers}-layer {trained[0].attention.upper()} "
                    f"K={trained[0].kv_heads} model, not this one")
                where = f"untrained weights (random init): {why}; the text is noise, the cache and timings are real"
            self._models[cfg] = (model, where)
        return self._models[cfg]

    # Running --------------------------------------------------------------------------------------
    def _check(self, cfg: dantinox.ModelConfig, batch: int, prompt_ids: list[int], use_cache: bool) -> None:
        """Refuse, with a reason, a run that cannot fit the context or would exceed the memory budget."""
        fmt = dantinox.format_bytes
        if not prompt_ids:
            raise ValueError("prompt: expected at least one character")
        end = len(prompt_ids) + self.new_tokens.value
        if end > cfg.max_context:
            raise ValueError(f"new tokens: prompt ({len(prompt_ids)} tokens) + {self.new_tokens.value} new "
                             f"tokens = {end} exceeds max_context={cfg.max_context} of this preset")
        if use_cache:
            need, what = dantinox.kv_cache_bytes(cfg, batch, cfg.max_context), "the static KV cache"
        else:  # the widest recompute materialises attention scores [B, N, S, S] in float32 per layer
            need, what = batch * cfg.n_heads * cfg.max_context**2 * 4, "recompute attention scores"
        if need > self.budget_bytes:
            raise ValueError(f"concurrency B: {what} for B={batch} needs {fmt(need)}, above the lab's budget "
                             f"({fmt(self.budget_bytes)}); lower B to decode for real")

    def run(self, use_cache: bool = True, wait: bool = False) -> None:
        """Decode with (or without) the cache in a background thread; `wait=True` blocks until it ends."""
        if self._thread is not None and self._thread.is_alive():
            self.status.value = note_box("A decode is already running; press stop first.")
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_safely, args=(use_cache,), daemon=True)
        self._set_busy(True)
        self._thread.start()
        if wait:
            self.wait()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_busy(self, busy: bool) -> None:
        self.cached_button.disabled = self.uncached_button.disabled = busy
        self.stop_button.disabled = not busy

    def _run_safely(self, use_cache: bool) -> None:
        try:
            self.error = ""
            self._decode(use_cache)
        except Exception as err:  # noqa: BLE001 - the thread must end cleanly and say why on screen
            self.error = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.status.value = error_box(self.error)
        finally:
            self._set_busy(False)

    def _decode(self, use_cache: bool) -> None:
        reading = self.lab.reading
        if reading is None:
            raise ValueError(f"lab: no valid setting to decode with ({self.lab.error})")
        cfg, batch = reading.cfg, reading.batch
        prompt_ids = tokenizer.encode(self.prompt.value)
        self._check(cfg, batch, prompt_ids, use_cache)
        model, where = self.model_for(cfg)
        self.status.value = note_box(esc(f"{where}. Preset {self.lab.preset.value}, {cfg.attention.upper()} "
                                         f"K={cfg.kv_heads}, cache {cfg.cache_dtype}, B={batch}."))
        key = "cache" if use_cache else "no cache"
        run = DecodeRun(use_cache=use_cache, batch=batch, prompt_tokens=len(prompt_ids))
        self._end = len(prompt_ids) + self.new_tokens.value  # the x range: where this run will stop
        self.runs[key] = run
        ids = np.tile(np.asarray([prompt_ids], np.int32), (batch, 1))
        start = time.perf_counter()
        for event in dantinox.stream(model, ids, self.new_tokens.value, use_cache=use_cache):
            now = time.perf_counter()
            run.seconds.append(now - start)
            start = now
            run.tokens.append(int(event.token[0]))
            run.held.append(event.index)
            if use_cache:
                run.allocated_bytes = dantinox.tree_nbytes(event.caches)
                slots = filled_slots(event.caches)
                run.filled_bytes.append(slots * run.allocated_bytes // cfg.max_context)
            self._show(run, cfg)
            if self._stop.is_set():
                run.stopped = True
                break
            start = time.perf_counter()  # leave the drawing out of the next token's time

    # Drawing --------------------------------------------------------------------------------------
    def _show(self, run: DecodeRun, cfg: dantinox.ModelConfig) -> None:
        self.text.value = (f"<div style='font-family:monospace;white-space:pre-wrap;word-break:break-all;"
                           f"border:1px solid #ddd;padding:4px'><b>{esc(self.prompt.value)}</b>"
                           f"{esc(tokenizer.decode(run.tokens, show_special=True))}</div>")
        lines = []
        for name, r in self.runs.items():
            rate = f"{r.tokens_per_s:,.1f} tokens/s" if len(r.seconds) > 1 else "…"
            lines.append(f"<b>{esc(name)}</b>: {len(r.tokens)} tokens × B={r.batch}, {esc(rate)} "
                         f"{badge('measured', 'wall clock, first token left out')}"
                         + (" (stopped)" if r.stopped else ""))
        if "cache" in self.runs and "no cache" in self.runs:
            a, b = self.runs["cache"], self.runs["no cache"]
            n = min(len(a.seconds), len(b.seconds))
            if n > 1:
                ratio = sum(b.seconds[1:n]) / sum(a.seconds[1:n])
                lines.append(f"without the cache each token took {ratio:,.1f}× as long over the same "
                             f"{n - 1} tokens {badge('measured')}")
        self.stats.value = "<br>".join(lines)
        self._draw(cfg)

    def _draw(self, cfg: dantinox.ModelConfig) -> None:
        traces = []
        cached = self.runs.get("cache")
        if cached is not None and cached.filled_bytes:
            traces.append(go.Scatter(x=cached.held, y=[b / MIB for b in cached.filled_bytes], mode="lines+markers",
                                     name="bytes held for filled tokens (measured)", xaxis="x", yaxis="y"))
            derived = [self.lab.derived_bytes(cfg, cached.batch, t) / MIB for t in cached.held]
            traces.append(go.Scatter(x=cached.held, y=derived, mode="lines", line=dict(dash="dot"),
                                     name="formula for those tokens (derived)", xaxis="x", yaxis="y"))
            traces.append(go.Scatter(x=[1, self._end], y=[cached.allocated_bytes / MIB] * 2, mode="lines",
                                     line=dict(dash="dash", color="grey"),
                                     name="allocated static cache (measured)", xaxis="x", yaxis="y"))
        for name, r in self.runs.items():  # the first token may include compiling: left out of the plot
            traces.append(go.Scatter(x=r.held[1:], y=[s * 1e3 for s in r.seconds[1:]], mode="lines+markers",
                                     name=f"per-token time, {name} (measured)", xaxis="x2", yaxis="y2"))
        fig = self.figure
        if len(fig.data) != len(traces):
            fig.data = []
            fig.add_traces(traces)
        else:
            with fig.batch_update():
                for old, new in zip(fig.data, traces, strict=True):
                    old.update(new.to_plotly_json())
