"""The diffusion lab: block-wise masked-diffusion decoding step by step, with no cache, a prefix cache or DualCache.

    lab = DiffusionLab(model, prompt="The KV cache")
    lab.update(block_size=8, threshold=0.7, gen_length=64)   # what the sliders do: all three modes run again
    lab.step.value = 5                                       # what the step slider and the play button do
    lab.runs["dual"].result.nfe, lab.runs["dual"].tokens_per_s, lab.runs["prefix"].agreement
    run_modes(model, prompt_ids, 64, 8, 0.7)                 # the same numbers without a widget

Every mode decodes the same prompt with the same settings. The lab draws one of them (the "show" toggle)
as prompt / finished blocks / active block / masked suffix, plots its cache bytes per step (derived from
the live positions, which the tests check against the arrays) beside the autoregressive static cache of
the same length, and tabulates all three side by side.

A new gen length or block size compiles three programs (seconds each); everything else is fast. So the
lab says what a change will cost before it runs (an estimate from the compiles it has already timed),
reports each mode as it finishes, disables its controls while it works, runs only the value a slider
settles on (moves arriving from the browser within SETTLE_S are one move), and reuses the runs of settings
it has already decoded. A run the browser starts works in a thread, so its stop button is heard: it stops
before the next compile or decode (one that has begun finishes), keeps what has compiled, and puts the
controls back to the settings whose runs are on screen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable

import ipywidgets as widgets
import numpy as np
import traitlets

import dantinox
from dantinox.architectures import tokenizer
from dantinox.generation.diffusion import CACHE_MODES, DiffusionResult, diffusion_generate
from widgets._controls import Lab, Stopped
from widgets._figure import FigureWidget
from widgets._html import badge, esc, note_box
from widgets.number_input import NumberInput
from widgets.readings import formula_params

KIB = 1024
COLOURS = {"prompt": "#eceff1", "finished": "#c8e6c9", "active": "#ffe0b2", "suffix": "#e3f2fd"}
PER_SLOT = "live positions × bytes per slot"  # how every per-step cache byte count here is derived
CACHED_MARK = "#6a1b9a"  # underline of positions whose keys/values the viewed mode reads from its cache
SETTLE_S = 0.4  # browser moves closer together than this run once, at the last value


@dataclasses.dataclass(frozen=True)
class ModeRun:
    """One mode's generation with the lab's settings, timed after compilation."""

    result: DiffusionResult
    seconds: float  # measured wall time of the (already compiled) generation
    agreement: float  # fraction of generated tokens equal to those of cache="none"

    @property
    def tokens_per_s(self) -> float:
        return self.result.tokens.shape[0] * self.result.gen_length / self.seconds


def run_modes(model: dantinox.Transformer, prompt_ids: np.ndarray, gen_length: int, block_size: int,
              threshold: float, compiled: set | None = None,
              progress: Callable[[str, float, float | None], None] | None = None,
              stop: threading.Event | None = None) -> dict[str, ModeRun]:
    """Decode the prompt in every cache mode with the same settings; each timed after its compilation.

    `compiled` holds the (gen_length, block_size, mode) programs known to be compiled: those run once, not
    twice, and the ones compiled here are added. `progress(mode, seconds, compile_seconds)` is called as each
    mode finishes (compile_seconds None when it was already compiled). Once `stop` is set, `Stopped` is raised
    before the next compile or decode.
    """

    def check() -> None:
        if stop is not None and stop.is_set():
            raise Stopped

    results, seconds = {}, {}
    for mode in CACHE_MODES:
        key, compile_s = (gen_length, block_size, mode), None
        if compiled is None or key not in compiled:
            check()
            start = time.perf_counter()
            diffusion_generate(model, prompt_ids, gen_length, block_size, threshold, mode)  # compile once per shape
            compile_s = time.perf_counter() - start
            if compiled is not None:
                compiled.add(key)
        check()
        start = time.perf_counter()
        results[mode] = diffusion_generate(model, prompt_ids, gen_length, block_size, threshold, mode)
        seconds[mode] = time.perf_counter() - start
        if progress is not None:
            progress(mode, seconds[mode], compile_s)
    P = prompt_ids.shape[1]
    base = results["none"].tokens[:, P:]
    return {m: ModeRun(r, seconds[m], float((r.tokens[:, P:] == base).mean())) for m, r in results.items()}


def _browser_loop(change: dict | None) -> asyncio.AbstractEventLoop | None:
    """The kernel's event loop if this change came from the browser, else None (run it now).

    ipywidgets locks a property while it applies the front end's update, so a locked name is a browser move.
    """
    if not change:
        return None
    owner = change["owner"]
    if not (owner.from_browser if isinstance(owner, NumberInput) else change["name"] in owner._property_lock):
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _char(token: int) -> str:
    if token == tokenizer.MASK:
        return "░"
    if token == 32:
        return "\u00a0"
    return chr(token) if 32 < token < 127 else "·"


def sequence_html(result: DiffusionResult, step: int, row: int = 0) -> str:
    """The sequence after `step` (1-based) as coloured cells: prompt, finished blocks, active block, suffix.

    Tokens decoded at this step are bold and boxed; positions the mode reads from its cache are underlined.
    """
    P, bs = result.prompt_length, result.block_size
    active = int(result.step_block[step - 1])
    start, end = P + active * bs, P + (active + 1) * bs
    cached = {"none": lambda i: False, "prefix": lambda i: i < start,
              "dual": lambda i: i < start or i >= end}[result.cache_mode]
    done = result.unmasked_by(step - 1)[row]
    cells = []
    for i, token in enumerate(result.tokens[row]):
        new = False
        if i < P:
            kind, shown = "prompt", int(token)
        else:
            j = i - P
            kind = "finished" if i < start else "active" if i < end else "suffix"
            shown = int(token) if done[j] else tokenizer.MASK
            new = result.unmasked_at[row, j] == step - 1
        style = f"background:{COLOURS[kind]};padding:1px 1px;margin:0 0 2px 0;display:inline-block;min-width:0.6em"
        if new:
            style += ";font-weight:bold;outline:1px solid #e65100"
        if cached(i):
            style += f";border-bottom:3px solid {CACHED_MARK}"
        cells.append(f"<span style='{style}'>{esc(_char(shown))}</span>")
    legend = " ".join(f"<span style='background:{c};padding:0 4px'>{k if k != 'suffix' else 'masked suffix'}</span>"
                      for k, c in COLOURS.items())
    legend += (f" <span style='border-bottom:3px solid {CACHED_MARK}'>read from the cache</span>"
               " <b style='outline:1px solid #e65100'>decoded at this step</b> ░ = MASK")
    return (f"<div style='font-family:monospace;font-size:14px;line-height:1.9;max-width:900px'>"
            f"{''.join(cells)}</div><div style='font-size:85%;margin-top:4px'>{legend}</div>")


class DiffusionLab(Lab):
    """Sliders for block size, threshold and generation length; a step-by-step view, a plot and a table."""

    CONTROLS = ("block_size", "threshold", "gen_length")
    RESULT = "runs"
    runs = traitlets.Dict()  # cache mode -> ModeRun at the current settings
    reused = traitlets.Bool(False)  # the last refresh showed runs decoded earlier at the same settings

    def __init__(self, model: dantinox.Transformer, prompt: str = "The KV cache",
                 gen_lengths: tuple[int, ...] = (32, 64, 96, 128), block_sizes: tuple[int, ...] = (4, 8, 16, 32),
                 gen_length: int = 64, block_size: int = 16, threshold: float = 0.9, show: str = "dual"):
        if not isinstance(model, dantinox.Transformer) or model.cfg.paradigm != "diffusion":
            raise ValueError("model: expected a dantinox.Transformer with paradigm='diffusion'")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompt: expected a non-empty string, got {prompt!r}")
        self.model = model
        self._compiled: set[tuple[int, int, str]] = set()  # (gen length, block size, mode) compiled by this lab
        self._compile_s: dict[str, float] = {}  # mode -> seconds its last new shape took to compile, measured
        self._memo: dict[tuple[int, int, float], dict[str, ModeRun]] = {}  # settings -> their runs
        self._pending: asyncio.TimerHandle | None = None  # the run a settling slider will start
        self._stop = threading.Event()  # set by the stop button; read between compiles and decodes
        self._worker: threading.Thread | None = None  # the run the browser started, in the background
        self._superseded = False  # a browser move arrived while that run worked: it stops and the move runs
        self.prompt_ids = np.array([tokenizer.encode(prompt)], np.int32)
        room = model.cfg.max_context - self.prompt_ids.shape[1]
        for g in gen_lengths:
            if g > room or any(g % b for b in block_sizes):
                raise ValueError(f"gen_lengths: each must be a multiple of every block size {block_sizes} and at "
                                 f"most max_context - prompt = {room}, got {g}")
        style = {"description_width": "120px"}
        wide = widgets.Layout(width="460px")
        self._room = room
        self.block_size = NumberInput(value=block_size, min=min(block_sizes), max=max(block_sizes),
                                      grid=sorted(block_sizes), description="block size", unit="tokens",
                                      check=self._check_block, continuous_update=False, style=style, layout=wide)
        self.threshold = NumberInput(value=threshold, min=0.05, max=1.0, step=0.05, integer=False,
                                     description="threshold", unit="probability", continuous_update=False,
                                     style=style, layout=wide)
        self.gen_length = NumberInput(value=gen_length, min=min(gen_lengths), max=max(gen_lengths),
                                      grid=sorted(gen_lengths), description="gen length", unit="tokens",
                                      check=self._check_gen_length, continuous_update=False, style=style,
                                      layout=wide)
        self.show = widgets.ToggleButtons(options=CACHE_MODES, value=show, description="show", style=style)
        self.step = widgets.IntSlider(min=1, max=1, value=1, description="step", style=style, layout=wide)
        self.play = widgets.Play(min=1, max=1, value=1, interval=350, description="play", tooltip=(
            "step through the decode: play, pause, stop (back to step 1), repeat at the end"))
        widgets.jslink((self.play, "value"), (self.step, "value"))
        widgets.jslink((self.play, "max"), (self.step, "max"))
        self.message = widgets.HTML()  # the lab's status line: running, or an error
        self.stop_button = widgets.Button(description="stop", icon="stop", disabled=True, tooltip=(
            "stop the run of new settings before its next compile or decode; the settings on screen come back"))
        self.stop_button.on_click(lambda _: self._stop.set())
        self.caption = widgets.HTML()
        self.sequence = widgets.HTML()
        self.table = widgets.HTML()
        self.figure = FigureWidget(layout=dict(
            height=340, margin=dict(l=60, r=20, t=50, b=40), hovermode="x unified",
            xaxis=dict(title="step (model evaluation)"), yaxis=dict(title="cache (KiB)", rangemode="tozero"),
            legend=dict(orientation="h", y=-0.25)))
        for name in ("prefix", "suffix", "total"):
            self.figure.add_scatter(mode="lines", line=dict(shape="hv"), name=f"{name} (derived: positions)")
        self.figure.add_scatter(mode="lines", line=dict(dash="dash", color="black"),
                                name="AR static cache, same length (derived: formula)")
        self.figure.add_scatter(mode="lines", line=dict(dash="dot", color="grey"),
                                name="static buffers allocated (measured: shapes)")
        self.show.observe(lambda _: self.guard(self._redraw), names="value")
        self.step.observe(lambda _: self.guard(self._draw_step), names="value")
        super().__init__([self.block_size, self.threshold, self.gen_length, self.stop_button, self.message,
                          self.table, self.show,
                          widgets.HBox([self.play, self.step]), self.caption, self.sequence, self.figure],
                         self.message)
        self.observe_controls(self.block_size, self.threshold, self.gen_length)
        self.refresh()

    # Controls ----------------------------------------------------------------------------------------
    def _check_block(self, block: int) -> None:
        """A block size must divide the generation length: the decode runs whole blocks."""
        gen = self.gen_length.value if hasattr(self, "gen_length") else block
        if gen % block:
            raise ValueError(f"block_size: expected a divisor of the gen length ({gen}), got {block}")

    def _check_gen_length(self, gen: int) -> None:
        """A generation length must be whole blocks and fit the context after the prompt."""
        block = self.block_size.value
        if gen % block or gen > self._room:
            raise ValueError(f"gen_length: expected a multiple of the block size ({block}) up to {self._room} "
                             f"(max_context - prompt), got {gen}")

    # Running -----------------------------------------------------------------------------------------
    def _settings(self) -> tuple[int, int, float]:
        return self.gen_length.value, self.block_size.value, round(float(self.threshold.value), 6)

    def _plan(self) -> str:
        """What running the current settings will cost, said before it runs (escaped HTML)."""
        gen, block, threshold = self._settings()
        what = f"gen length {gen}, block {block}, threshold {threshold:.2f}"
        new = [m for m in CACHE_MODES if (gen, block, m) not in self._compiled]
        if not new:
            return f"Decoding none, prefix and dual ({what}); these shapes are compiled&hellip;"
        known = [self._compile_s[m] for m in new if m in self._compile_s]
        estimate = (f"about {sum(known):.0f} s (measured: compiling took that here for an earlier shape)"
                    if len(known) == len(new) else "no estimate yet: nothing has been compiled in this lab")
        return (f"<b>A new gen length or block size</b> ({what}): compiling {len(new)} program(s) "
                f"({', '.join(new)}), then decoding: {estimate}. The controls are disabled until it is done.")

    def refresh(self) -> dict[str, ModeRun] | None:
        """Run (or reuse) the three modes at the current settings; the controls are disabled while it works.
        Stopped, the controls go back to the settings whose runs are on screen."""
        if self._settings() in self._memo:
            return super().refresh()
        busy = (self.block_size, self.threshold, self.gen_length, self.show, self.step, self.play)
        for control in busy:
            control.disabled = True  # sent at once: a move made while decoding would otherwise queue a run
        old_table = self.table.value
        if self.runs:  # the old table stays readable but says it is the old one until the new runs replace it
            self.table.value = (f"<div style='color:#8d6e63'><b>previous settings</b> (decoding the new ones, see "
                                f"above)</div><div style='opacity:0.45'>{old_table}</div>")
        try:
            return super().refresh()
        except Stopped:
            if self._superseded:  # newer settings run next: the controls stay as the learner left them
                self.table.value = old_table
            else:
                self._put_back(old_table)
            return None
        finally:
            for control in busy:
                control.disabled = False

    def _put_back(self, table: str) -> None:
        """After a stop: the controls at the settings of the runs on screen, and the line says what happened."""
        stopped = self._settings()
        if self.runs:
            r = self.runs["dual"].result
            # both checked once both are set: each one's rule reads the other (a block divides the length)
            with self.batched(), self.gen_length.hold_trait_notifications(), \
                    self.block_size.hold_trait_notifications():
                self.gen_length.value, self.block_size.value = r.gen_length, r.block_size
                self.threshold.value = round(float(r.threshold), 6)
        self.table.value = table
        compiled = [m for m in CACHE_MODES if (stopped[0], stopped[1], m) in self._compiled]
        kept = f" (compiled and kept for a second try: {', '.join(compiled)})" if compiled else ""
        self.message.value = note_box(f"Stopped before decoding gen length {stopped[0]}, block {stopped[1]}, "
                                      f"threshold {stopped[2]:.2f}{kept}; the settings of the table below are "
                                      f"back.")

    def _on_change(self, change=None) -> None:
        """A move from the browser runs once the slider settles; a change made in code runs now."""
        if self._quiet:
            return
        loop = _browser_loop(change)
        if loop is None:
            self.refresh()
            return
        if self._pending is not None:
            self._pending.cancel()
        if self._running():  # a move that reached the kernel before the controls were disabled: it wins
            self._superseded = True
            self._stop.set()
        self.message.value = "" if self._settings() in self._memo else note_box(self._plan())
        self._pending = loop.call_later(SETTLE_S, self._settled)

    def _running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def _settled(self) -> None:
        """The slider has settled: run in a thread, so the kernel still hears the stop button."""
        if self._running():  # a superseded run is still ending: after it
            self._pending = asyncio.get_running_loop().call_later(SETTLE_S, self._settled)
            return
        self._pending = None
        if self._settings() in self._memo:
            self.refresh()
            return
        self._stop.clear()
        self._superseded = False
        self.stop_button.disabled = False
        self._worker = threading.Thread(target=self._run_in_background, daemon=True)
        self._worker.start()

    def _run_in_background(self) -> None:
        try:
            self.refresh()  # shows its own errors
        finally:
            self.stop_button.disabled = True

    def wait(self, timeout: float | None = None) -> None:
        """Until a run the browser started has ended (for tests and scripts)."""
        if self._worker is not None:
            self._worker.join(timeout)

    def _read(self) -> dict[str, ModeRun]:
        key = self._settings()
        self.reused = key in self._memo
        if self.reused:
            return self._memo[key]
        plan, done = self._plan(), []

        def progress(mode: str, seconds: float, compile_s: float | None) -> None:
            if compile_s is not None:
                self._compile_s[mode] = compile_s
            done.append(f"{mode} done ({'' if compile_s is None else f'compiled in {compile_s:.1f} s, '}"
                        f"decoded in {seconds * 1e3:.0f} ms)")
            self.message.value = note_box(f"{plan}<br>{' &middot; '.join(done)}")

        self.message.value = note_box(plan)  # a run takes seconds: say so, or the old table reads as the new one
        # only a run in the background hears the stop button (one in the kernel's thread holds the kernel)
        stop = self._stop if threading.current_thread() is self._worker else None
        runs = run_modes(self.model, self.prompt_ids, key[0], key[1], key[2], self._compiled, progress, stop)
        self._memo[key] = runs
        return runs

    def _render(self, runs: dict[str, ModeRun]) -> None:
        self.message.value = note_box("These settings were decoded earlier in this lab: their runs are shown "
                                      "again (times measured then).") if self.reused else ""
        self._table(runs)
        self._redraw()

    # Drawing -----------------------------------------------------------------------------------------
    def _table(self, runs: dict[str, ModeRun]) -> None:
        fmt = dantinox.format_bytes
        none = runs["none"]
        head = ("<tr><th>cache</th><th title='number of function evaluations: model calls, one per step'>NFE</th>"
                "<th>positions run</th><th>time</th><th>tokens/s</th>"
                "<th>vs none</th><th>same tokens as none</th><th>peak cache</th><th>buffers</th></tr>")
        rows = []
        for cache, run in runs.items():
            r = run.result
            rows.append(f"<tr><td><b>{cache}</b></td><td>{r.nfe}</td><td>{int(r.computed_tokens.sum()):,}</td>"
                        f"<td>{run.seconds * 1e3:.1f} ms</td><td>{run.tokens_per_s:,.0f}</td>"
                        f"<td>{none.seconds / run.seconds:.2f}×</td><td>{run.agreement:.0%}</td>"
                        f"<td>{fmt(r.peak_cache_bytes)}</td><td>{fmt(r.allocated_bytes)}</td></tr>")
        ar = dantinox.format_bytes(none.result.ar_static_bytes)
        self.table.value = (f"<div>times: {badge('measured', 'this kernel, this machine')} · peak cache: "
                            f"{badge('derived', PER_SLOT)} · buffers: "
                            f"{badge('measured', 'shapes')} · AR static cache for the same length: {ar} "
                            f"{badge('derived', 'kv_cache_bytes')}</div>"
                            f"<table style='border-collapse:collapse;text-align:right' cellpadding='4'>{head}"
                            f"{''.join(rows)}</table>")

    def _redraw(self) -> None:
        r = self.runs[self.show.value].result
        steps = np.arange(1, r.nfe + 1)
        with self.figure.batch_update():
            for trace, values in zip(self.figure.data, (r.prefix_bytes, r.suffix_bytes, r.cache_bytes,
                                                        np.full(r.nfe, r.ar_static_bytes),
                                                        np.full(r.nfe, r.allocated_bytes)), strict=True):
                trace.x, trace.y = steps, np.asarray(values) / KIB
            self.figure.layout.title = (f"cache bytes per step, cache_mode='{r.cache_mode}', gen {r.gen_length}, "
                                        f"block {r.block_size}")
        with self.hold_sync():
            self.play.max = r.nfe
            self.step.max = r.nfe
            self.step.value = min(self.step.value, r.nfe)
        self._draw_step()

    def _draw_step(self) -> None:
        run = self.runs[self.show.value]
        r, k = run.result, self.step.value
        block = int(r.step_block[k - 1])
        decoded = int((r.unmasked_at[0] == k - 1).sum())
        first = k == 1 or r.step_block[k - 2] != block
        kind = "full forward, refreshes the cache" if first and r.cache_mode != "none" else \
            "full forward" if r.cache_mode == "none" else "cached step"
        self.caption.value = (
            f"<b>step {k} of {r.nfe}</b>, block {block + 1} of {r.gen_length // r.block_size} ({kind}): "
            f"{r.computed_tokens[k - 1]} positions through the model, {decoded} token(s) decoded; cache read: "
            f"prefix {dantinox.format_bytes(int(r.prefix_bytes[k - 1]))}, suffix "
            f"{dantinox.format_bytes(int(r.suffix_bytes[k - 1]))} {badge('derived', PER_SLOT)}")
        self.sequence.value = sequence_html(r, k)
        with self.figure.batch_update():
            self.figure.layout.shapes = [dict(type="line", x0=k, x1=k, yref="paper", y0=0, y1=1,
                                              line=dict(color="#e65100", width=1))]

    # For the quiz ------------------------------------------------------------------------------------
    def formula_params(self) -> dict[str, float]:
        """The lab's numbers under the content entry's variable names (DualCache size and work ratio)."""
        r = self.runs["dual"].result
        return formula_params(self.model.cfg, 1, r.prompt_length + r.gen_length, W=r.block_size,
                              s=int(r.steps_per_block[0]))
