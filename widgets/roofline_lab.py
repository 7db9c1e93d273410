"""The roofline lab: measured step times of the model beside the roofline of this machine and of datasheet GPUs.

    machine = read_machine()                       # measured, this machine
    lab = RooflineLab(content.load_entry("prefill-and-decode"), machine, devices=read_devices(),
                      decode=read_decode(cfg, 128, (1, 16, 64)), prefill=read_prefill(cfg, (32, 128, 512)))
    lab.batch.value = 32                           # any control, as a learner would move it
    lab.reading.devices[1].bound                   # "memory" on an A100 at this batch

Sliders change only derived curves (instant); one button times the current model on this machine, the
other profiles one of its decode steps at the current batch and context (where the time goes). Pressed in the
page, each runs in a thread so that the stop button is heard. The timing stops before its next batch or
prompt length, and the ones timed are kept for the next press. The profile stops before its next stage
(building the model, compiling the decode loop, a warm-up run, the profiled run, reading the trace:
`PROFILE_STAGES`); a stage already started runs to its end, and nothing of a stopped profile is kept. The
attention control offers MLA too (a latent of width C, the "latent width C" control, and a RoPE key of
H / 2, as DeepSeek-V2 sizes it).
"""

from __future__ import annotations

import threading
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import traitlets
from plotly.subplots import make_subplots

import dantinox
from dantinox.accounting import roofline
from dantinox.accounting.profile import CATEGORIES, STAGES, StepProfile
from dantinox.architectures.config import DTYPES, heads_fields
from widgets._controls import Lab, Stopped, describe
from widgets._figure import FigureWidget
from widgets._html import badge, error_box, esc, note_box
from widgets.cache_lab import fit_kv_heads
from widgets.number_input import NumberInput
from widgets.roofline_reading import (
    BUILDING,
    RooflineReading,
    Sweep,
    joined,
    read_decode,
    read_prefill,
    read_step_profile,
    roofline_reading,
)

BATCH_GRID = np.unique(np.round(2 ** np.linspace(0, 8, 41)).astype(int)).tolist()  # 1 … 256
PROFILE_STAGES = (BUILDING, *STAGES)  # a stop takes effect before the next of these


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms" if seconds < 1e-2 else f"{seconds * 1e3:,.1f} ms"


class RooflineLab(Lab):
    """Sliders for batch, context, attention variant, KV heads and cache dtype; a plot and readouts."""

    ATTENTIONS = ("mha", "gqa", "mqa", "mla")
    CONTROLS = ("attention", "kv_heads", "latent", "cache_dtype", "batch", "context")
    reading = traitlets.Instance(RooflineReading, allow_none=True)

    def __init__(self, entry: Any, machine: roofline.Machine, *, decode: Sweep | None = None,
                 prefill: Sweep | None = None, devices: tuple[roofline.Machine, ...] = (),
                 preset: str = "reference", batch: int = 8, context: int = 128, attention: str = "gqa",
                 kv_heads: int | None = 2, latent: int | None = None, cache_dtype: str = "bfloat16",
                 batches: tuple[int, ...] = (1, 16, 64),
                 prompts: tuple[int, ...] = (32, 128, 512), repeats: int = 3):
        self.entry, self.machine, self.devices = entry, machine, tuple(devices)
        self.base = dantinox.ModelConfig.preset(preset)
        self.batches, self.prompts, self.repeats = tuple(batches), tuple(prompts), repeats
        self._decode: dict[tuple, Sweep] = {}
        self._prefill: dict[dantinox.ModelConfig, Sweep] = {}
        for sweep in (decode, prefill):
            if sweep is not None:
                self._keep(sweep)
        style, layout = {"description_width": "150px"}, widgets.Layout(width="520px")
        self.batch = NumberInput(value=1, min=1, max=BATCH_GRID[-1], grid=BATCH_GRID, scale="log",
                                 description="batch B", unit="sequences", style=style, layout=layout)
        self.context = NumberInput(value=1, min=1, max=self.base.max_context, description="context (cache slots)",
                                   unit="slots", style=style, layout=layout)
        self.attention = widgets.ToggleButtons(options=list(self.ATTENTIONS), description="attention", style=style)
        self.kv_heads = widgets.Dropdown(description="KV heads K", style=style, layout=layout)
        H = self.base.head_size  # an MLA model's latent widths, in head sizes; shown for MLA instead of K
        self.latent = widgets.Dropdown(options=[H // 2, H, 2 * H, 4 * H, 8 * H], value=2 * H,
                                       description="latent width C", style=style,
                                       layout=widgets.Layout(width="520px", display="none"))
        self.cache_dtype = widgets.Dropdown(options=list(DTYPES), description="cache dtype", style=style,
                                            layout=layout)
        self.measure_button = widgets.Button(description="time this model here", icon="stopwatch",
                                             layout=widgets.Layout(width="220px"))
        self.profile_button = widgets.Button(description="where does a step's time go?", icon="search",
                                             layout=widgets.Layout(width="260px"))
        self.stop_button = widgets.Button(description="stop", icon="stop", disabled=True, tooltip=(
            "stop the timing before its next batch or prompt length (what was timed is kept), or the profile "
            "before its next stage"))
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None  # a timing the button started, in the background
        self.readout_html, self.devices_html, self.profile_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.profile: StepProfile | None = None
        self.figure = FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=(
            "decode: one step vs batch", "prefill: one call vs prompt length")))
        self._build_traces()
        buttons = widgets.HBox([self.measure_button, self.profile_button, self.stop_button])
        controls = [self.batch, self.context, self.attention, self.kv_heads, self.latent, self.cache_dtype,
                    buttons]
        super().__init__([*controls, status := widgets.HTML(), self.figure, self.readout_html, self.profile_html,
                          self.devices_html], status)
        self.attention.observe(self._on_attention, names="value")
        self.observe_controls(self.batch, self.context, self.kv_heads, self.latent, self.cache_dtype)
        self.measure_button.on_click(lambda _: self._in_background(self.measure))
        self.profile_button.on_click(lambda _: self._in_background(self.profile_step))
        self.stop_button.on_click(lambda _: self._stop.set())
        with self.batched():
            self._fit_kv_heads()
        self.update(batch=batch, context=context, attention=attention, latent=latent, cache_dtype=cache_dtype,
                    kv_heads=None if attention == "mla" else kv_heads)

    # Controls -----------------------------------------------------------------------------------
    def _fit_kv_heads(self) -> None:
        """K for the heads variants; for MLA, K gives way to the latent width C."""
        mla = self.attention.value == "mla"
        fit_kv_heads(self.kv_heads, "gqa" if mla else self.attention.value, self.base.n_heads)
        self.kv_heads.disabled = self.kv_heads.disabled or mla
        self.kv_heads.layout.display = "none" if mla else None
        self.latent.layout.display = None if mla else "none"

    def _on_attention(self, _change) -> None:
        with self.batched():
            self._fit_kv_heads()
        self._on_change()

    def config(self) -> dantinox.ModelConfig:
        """The model the controls describe (MLA: a latent of the chosen width C and a RoPE key of H / 2)."""
        if self.attention.value == "mla":
            return self.base.replace(attention="latent", kv_latent_dim=self.latent.value,
                                     rope_head_dim=self.base.head_size // 2,
                                     cache_dtype=self.cache_dtype.value)
        return self.base.replace(**heads_fields(self.attention.value, self.base.n_heads, self.kv_heads.value),
                                 cache_dtype=self.cache_dtype.value)

    # Measuring ----------------------------------------------------------------------------------
    def _keep(self, sweep: Sweep) -> None:
        if sweep.phase == "decode":
            self._decode[(sweep.cfg, sweep.fixed)] = sweep
        else:
            self._prefill[sweep.cfg] = sweep

    def measure(self, stop: threading.Event | None = None) -> RooflineReading | None:
        """Time the current model here: decode at the lab's batches, prefill at its prompt lengths, one at a time
        (each timing is kept); once `stop` is set, it stops before the next one and shows what it has."""
        cfg, context = self.config(), self.context.value
        prompts = tuple(p for p in self.prompts if p <= cfg.max_context)
        done = []

        def timed(read, *args) -> Sweep:
            if stop is not None and stop.is_set():
                raise Stopped
            sweep = read(*args)
            done.append(sweep)
            return sweep

        def time_it() -> None:
            decode = [timed(read_decode, cfg, context, (b,), self.repeats) for b in self.batches]
            prefill = [timed(read_prefill, cfg, (p,), 1, self.repeats) for p in prompts]
            self._keep(joined(decode))
            self._keep(joined(prefill))

        def stopped() -> str:
            return (f"Stopped after {len(done)} of {len(self.batches) + len(prompts)} timings; they are kept, so "
                    f"pressing <b>time this model here</b> again times only the rest.")

        return self._measure(f"Timing decode at B = {esc(self.batches)} and prefill at {esc(prompts)} tokens on "
                             "this machine (compiles first); <b>stop</b> ends it before the next one …", time_it,
                             stop=stop, stopped=stopped)

    def _in_background(self, work) -> None:
        """A button: `work(stop)` (the timing or the profile) in a thread, so the kernel hears the stop button
        meanwhile."""
        if self._worker is not None and self._worker.is_alive():  # a click that reached the kernel late
            return
        self._stop.clear()
        self._worker = threading.Thread(target=work, args=(self._stop,), daemon=True)
        self._worker.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until a timing or profile a button started has ended (for tests and scripts)."""
        if self._worker is not None:
            self._worker.join(timeout)

    def profile_step(self, stop: threading.Event | None = None) -> StepProfile | None:
        """Profile decode steps of the current model at the current batch and context (XLA's profiler); once
        `stop` is set, it stops before the next of PROFILE_STAGES and keeps nothing."""
        cfg, batch, context = self.config(), self.batch.value, self.context.value
        what = f"Profiling decode steps at B = {batch}, {context} cache slots on this machine"
        reached: list[str] = []

        def before(stage: str) -> None:
            if stop is not None and stop.is_set():
                raise Stopped
            reached.append(stage)
            ends = "; <b>stop</b> ends it before the next stage" if stop is not None else ""
            self.status_html.value = note_box(f"{what}: {esc(stage)} (stage {len(reached)} of "
                                              f"{len(PROFILE_STAGES)}){ends} …")

        got: list[StepProfile] = []

        def profile_it() -> None:
            got.append(read_step_profile(cfg, batch, context, before=before))
            self.profile = got[0]

        def stopped() -> str:
            done = ", ".join(reached) or "nothing"
            return (f"Stopped the profile before {esc(PROFILE_STAGES[len(reached)])} (done: {esc(done)}); "
                    f"nothing of it is kept, so <b>where does a step's time go?</b> starts it again.")

        self._measure(f"{what} (compiles first) …", profile_it, stop=stop, stopped=stopped)
        return got[0] if got else None

    def _measure(self, note: str, work, stop: threading.Event | None = None,
                 stopped=None) -> RooflineReading | None:
        """Run a measurement with `note` on screen, the buttons saying they are working and every control
        disabled (a click or a move would queue behind it), the stop button offered when `stop` can end it,
        then redraw; an error is shown, never raised; a stop redraws what there is and says `stopped()`."""
        self.status_html.value = note_box(note)
        busy = (self.measure_button, self.profile_button, self.batch, self.context, self.attention, self.kv_heads,
                self.latent, self.cache_dtype)
        was = [c.disabled for c in busy]  # the KV-heads dropdown is disabled for MHA and MQA: keep that
        labels = [(b, b.description, b.icon) for b in (self.measure_button, self.profile_button)]
        for control in busy:
            control.disabled = True
        for button, _, _ in labels:
            button.description, button.icon = "working… (see the note below)", "hourglass-half"
        self.stop_button.disabled = stop is None
        try:
            work()
        except Stopped:
            reading = self.refresh()
            self.status_html.value = note_box(stopped())
            return reading
        except Exception as err:  # noqa: BLE001 - shown on screen; the lab must survive any setting
            self.error = describe(err)
            self.status_html.value = error_box(self.error)
            return None
        finally:
            self.stop_button.disabled = True
            for control, disabled in zip(busy, was, strict=True):
                control.disabled = disabled
            for button, description, icon in labels:
                button.description, button.icon = description, icon
        return self.refresh()

    # Reading and drawing ------------------------------------------------------------------------
    def _read(self) -> RooflineReading:
        cfg, context = self.config(), self.context.value
        return roofline_reading(self.entry, cfg, self.batch.value, context, self.machine,
                                self._decode.get((cfg, context)), self._prefill.get(cfg), self.devices)

    def _build_traces(self) -> None:
        # one colour per curve in both panels, so the one legend reads for both
        style = [("roofline, derived", dict(width=3, color="#1f77b4")),
                 ("bytes / bandwidth", dict(width=1.5, dash="dash", color="#ff7f0e")),
                 ("FLOPs / peak", dict(width=1.5, dash="dot", color="#2ca02c"))]
        for col in (1, 2):
            for name, line in style:
                self.figure.add_trace(go.Scatter(mode="lines", name=name, line=line, showlegend=col == 1,
                                                 legendgroup=name), row=1, col=col)
            self.figure.add_trace(go.Scatter(mode="markers", name="measured, this machine", showlegend=col == 1,
                                             marker=dict(size=10, color="black"), legendgroup="m"), row=1, col=col)
        for name, line in (("critical batch F/BW, derived (decode)", dict(color="firebrick", dash="dash")),
                           ("measured knee (decode)", dict(color="black", dash="dot"))):
            self.figure.add_trace(go.Scatter(mode="lines", name=name, line=line), row=1, col=1)
        self.figure.add_trace(go.Scatter(mode="markers", name="your batch (decode)", marker=dict(
            size=15, color="rgba(0,0,0,0)", line=dict(width=2.5, color="crimson"))), row=1, col=1)
        self.figure.update_layout(height=450, autosize=True, margin=dict(l=60, r=20, t=70, b=40),
                                  legend=dict(orientation="h", y=-0.2))
        self.figure.update_xaxes(type="log", title_text="batch B (tokens per step)", row=1, col=1)
        self.figure.update_xaxes(type="log", title_text="prompt tokens (B = 1)", row=1, col=2)
        self.figure.update_yaxes(type="log", title_text="time (ms)", row=1, col=1)
        self.figure.update_yaxes(type="log", row=1, col=2)

    def _curves(self, costs: list[roofline.StepCost]) -> list[list[float]]:
        m = self.machine
        return [[1e3 * c.time(m) for c in costs], [1e3 * c.memory_time(m) for c in costs],
                [1e3 * c.compute_time(m) for c in costs]]

    def _render(self, r: RooflineReading) -> None:
        cfg = r.cfg
        prompts = np.unique(np.round(2 ** np.linspace(3, np.log2(cfg.max_context), 25)).astype(int)).tolist()
        decode = self._curves([roofline.decode_cost(cfg, b, r.context) for b in BATCH_GRID])
        prefill = self._curves([roofline.prefill_cost(cfg, 1, p) for p in prompts])
        lo, hi = min(decode[0]), max(decode[0])
        here = r.devices[0]
        with self.figure.batch_update():
            data = self.figure.data
            for i in range(3):
                data[i].update(x=BATCH_GRID, y=decode[i])
                data[4 + i].update(x=prompts, y=prefill[i])
            for trace, pts in ((data[3], r.decode_points), (data[7], r.prefill_points)):
                trace.update(x=[p.x for p in pts], y=[1e3 * p.seconds for p in pts],
                             text=[f"{p.label}<br>{p.percent_of_roofline:.0f}% of roofline" for p in pts],
                             hovertemplate="%{text}<br>%{y:.3f} ms<extra></extra>")
            data[8].update(x=[here.critical_batch] * 2, y=[lo, hi])
            knee = r.measured_knee
            data[9].update(x=[knee] * 2 if knee else [], y=[lo, hi] if knee else [])
            data[10].update(x=[r.batch], y=[1e3 * r.decode_cost.time(self.machine)])
            mla = cfg.variant == "mla"
            shape = f"C={cfg.kv_latent_dim}, R={cfg.rope_head_dim}" if mla else f"K={cfg.n_kv_heads}"
            self.figure.layout.title.text = (
                f"{cfg.variant.upper()} ({shape}), {cfg.cache_dtype} cache, {r.context} slots — "
                f"lines derived from the config and the measured machine; dots measured here")
        self._render_readouts(r)
        self._render_profile(r)

    def _render_profile(self, r: RooflineReading) -> None:
        p = self.profile
        if p is None or (p.cfg, p.batch, p.context) != (r.cfg, r.batch, r.context):  # only this very setting
            self.profile_html.value = ("<b>Where a step's time goes</b>: press <b>where does a step's time go?</b> to "
                                       "profile this setting.")
            return
        m, rows = self.machine, []
        for cat in CATEGORIES:
            seconds, rate = p.seconds[cat], p.bandwidth(cat)
            floor_ms = _ms(p.read_bytes[cat] / m.bandwidth) if cat in p.read_bytes else "—"
            rows.append(f"<tr><td>{esc(cat)}</td><td style='text-align:right'>{_ms(seconds)}</td>"
                        f"<td style='text-align:right'>{100 * seconds / p.total:.0f}%</td>"
                        f"<td style='text-align:right'>{'—' if rate is None else f'{rate / 1e9:,.1f} GB/s'}</td>"
                        f"<td style='text-align:right'>{floor_ms}</td></tr>")
        head = "".join(f"<th>{h}</th>" for h in ("ops", "time per step", "share", "bytes it must read / time",
                                                  "its bytes / measured bandwidth"))
        self.profile_html.value = (
            f"<b>Where a step's time goes</b> at B={r.batch}, {r.context} cache slots "
            f"{badge('measured', 'XLA profiler: per-op times of the compiled decode loop, this machine')} "
            f"<table><tr>{head}</tr>{''.join(rows)}</table><small>The last column is derived (roofline bytes over "
            f"the measured {m.bandwidth / 1e9:,.1f} GB/s). Ops sorted by the model's named scopes; the profiler "
            f"adds a little to each op, so the total ({_ms(p.total)}) can exceed the timed step.</small>")

    def _render_readouts(self, r: RooflineReading) -> None:
        m, c = self.machine, r.decode_cost
        fmt = dantinox.format_bytes
        notes = []
        if not r.decode_points:
            notes.append("No timings of this exact model and context yet: the dots are hidden. Press "
                         "<b>time this model here</b> to measure it (a few seconds per batch).")
        if any(p.percent_of_roofline > 100 for p in (*r.decode_points, *r.prefill_points)):
            notes.append("A dot below the roofline means the step beat the measured streaming bandwidth: part of "
                         "the bytes stayed in the CPU's last-level cache, or the bandwidth probe ran while other "
                         "work shared the memory bus.")
        self.status_html.value = note_box("<br>".join(notes)) if notes else ""
        knee = f"B ≈ {r.measured_knee:.0f}" if r.measured_knee else "needs a timed sweep from B = 1"
        cross = f"B = {r.crossover_batch:,}" if r.crossover_batch else "never (memory-bound at every batch)"
        rows = [
            ("this machine", f"{m.bandwidth / 1e9:,.1f} GB/s read · {m.peak_flops / 1e9:,.0f} GFLOP/s f32",
             badge("measured", "this machine: " + m.source)),
            (f"critical batch F/BW · {c.weight_bytes // roofline.weight_count(r.cfg)}/2 "
             f"({r.cfg.weights_dtype} weights)",
             f"{r.devices[0].critical_batch:,.1f} tokens",
             badge("derived", "content: Critical batch size, measured F and BW")),
            ("where this model's step turns compute-bound", cross,
             badge("derived", "roofline incl. cache and attention")),
            ("measured knee", knee, badge("measured", "t(1) · B_max / t(B_max)")),
            (f"bytes per step at B={r.batch}", f"{fmt(c.bytes)} (weights {fmt(c.weight_bytes)}, cache read "
             f"{fmt(c.cache_read_bytes)})", badge("derived")),
            (f"FLOPs per step at B={r.batch}", f"{c.flops / 1e9:,.3f} GFLOP", badge("derived")),
            ("roofline step time", f"{_ms(c.time(m))} ({c.bound(m)}-bound)", badge("derived", "max of the two")),
            ("memory floor, content formula", _ms(r.floor_formula_seconds),
             badge("derived", "Decode step time lower bound, n = 1")),
        ]
        rows += [(f"{p.label.split(': ', 1)[1].split(',')[0]} at {p.x}", f"{_ms(p.seconds)} = "
                  f"{p.percent_of_roofline:.0f}% of roofline", badge("measured"))
                 for p in (*r.decode_points, *r.prefill_points)]
        self.readout_html.value = _table(rows)
        head = "".join(f"<th>{h}</th>" for h in ("device", "bandwidth", "peak", "critical batch",
                                                  f"at B={r.batch}", "step floor", f"largest batch, T={r.context}"))
        body = "".join(
            f"<tr><td>{esc(d.machine.name)} {badge(d.machine.kind)}</td><td>{d.machine.bandwidth / 1e12:,.3g} TB/s"
            f"</td><td>{d.machine.peak_flops / 1e12:,.3g} TFLOP/s {esc(d.cfg.dtype)}</td>"
            f"<td>{d.critical_batch:,.0f}</td><td>{d.bound}-bound</td><td>{_ms(d.floor_seconds)}</td>"
            f"<td>{d.max_batch:,}</td></tr>" for d in r.devices)
        self.devices_html.value = (
            f"<b>The same step on other machines</b> {badge('derived', 'datasheet F and BW from content')}"
            f"<table><tr>{head}</tr>{body}</table><small>Datasheet peaks are dense bf16, so there the weights "
            f"are taken in bf16; memory from dantinox.DEVICE_PRESETS.</small>")


def _table(rows: list[tuple[str, str, str]]) -> str:
    style = "text-align:right;font-family:monospace;white-space:nowrap"
    return "<table>" + "".join(f"<tr><td style='min-width:260px'>{esc(a)}</td><td style='{style}'>{esc(b)}</td>"
                               f"<td>{c}</td></tr>" for a, b, c in rows) + "</table>"
