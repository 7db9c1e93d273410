"""Watch a published model's cache fill while its working model decodes: a panel of the real-models lab.

    panel = CacheFillPanel(model="gpt-oss-20b", tokens=256)
    panel.run(wait=True)            # what the decode button does (in a thread; the stop button ends it early)
    panel.step.value = 130          # the per-layer chart and the readout at that step
    panel.steps[-1].bytes, panel.plan.allocated

The numbers come from widgets/cache_fill.py (measured from the decode, beside the ledger's formula); this module
only draws them.
"""

from __future__ import annotations

import threading
import time

import ipywidgets as widgets
import numpy as np

import dantinox
from dantinox.accounting.kv_ledger import CACHE_DTYPES
from dantinox.accounting.working_model import working_config
from dantinox.architectures.catalogue import Architecture, catalogue, load_architecture
from widgets._a11y import LIVE, Aria
from widgets._controls import describe
from widgets._figure import FigureWidget
from widgets._html import badge, error_box, esc, note_box, readout_table
from widgets.cache_fill import FillPlan, FillStep, decode_fill, disagreements, fill_plan, kind_summary
from widgets.number_input import NumberInput
from widgets.real_models_lab import KIND_COLOURS

MAX_TOKENS = 4096  # decode steps one press may ask for (each a compiled step: milliseconds to tens of them)
REDRAWS_PER_S = 4  # while decoding, the charts follow at most this often
HEAT_COLUMNS = 400  # the heat map shows at most this many steps (evenly spaced), the last one always


def buildable(arch: Architecture) -> bool:
    """Whether the working model builds every layer of `arch` (its config is refused otherwise, in one line)."""
    try:
        working_config(arch, 1)
    except ValueError:
        return False
    return True


class CacheFillPanel(widgets.VBox):
    """Pick a model, press decode, move through the steps: each layer's cache, measured beside the ledger."""

    def __init__(self, *, model: str = "gpt-oss-20b", tokens: int = 256, cache_dtype: str = "bfloat16",
                 archs: dict[str, Architecture] | None = None):
        if archs is None:
            archs = {name: load_architecture(name) for name in catalogue()}
        self._archs = {name: arch for name, arch in archs.items() if buildable(arch)}
        if model not in self._archs:
            raise ValueError(f"model: expected one of {', '.join(self._archs)}, got {model!r}")
        style, layout = {"description_width": "150px"}, widgets.Layout(width="560px")
        self.model = widgets.Dropdown(options=list(self._archs), value=model, description="model", style=style,
                                      layout=layout)
        self.tokens = NumberInput(value=tokens, min=1, max=MAX_TOKENS, scale="log", description="decode tokens",
                                  unit="tokens", style=style, layout=layout)
        self.cache_dtype = widgets.Dropdown(options=list(CACHE_DTYPES), value=cache_dtype, description="cache dtype",
                                            style=style, layout=layout)
        self.decode_button = widgets.Button(description="decode and watch the cache fill", button_style="primary",
                                            icon="play", layout=widgets.Layout(width="280px"))
        self.stop_button = widgets.Button(description="stop", icon="stop", disabled=True,
                                          layout=widgets.Layout(width="90px"))
        self.step = widgets.IntSlider(value=1, min=1, max=1, description="decoded step", disabled=True, style=style,
                                      layout=layout, continuous_update=True)
        self.progress, self.status, self.readout = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.status.add_class(LIVE)  # a refusal or an error is read out (the progress line, 4 times a second, is not)
        margin = dict(t=60, b=40, l=70, r=20)
        self.layers_fig = FigureWidget(layout=dict(height=320, margin=margin, xaxis_title="layer",
                                                   yaxis_title="bytes held", legend=dict(orientation="h", y=-0.2)))
        self.heat_fig = FigureWidget(layout=dict(height=340, margin=margin, xaxis_title="decoded step (tokens held)",
                                                 yaxis_title="layer"))
        self.plan: FillPlan | None = None
        self.steps: list[FillStep] = []
        self.stopped = False
        self.error = ""
        self.build_seconds = 0.0  # the first step: building the model and compiling its step
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.decode_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self._stop.set())
        self.step.observe(lambda _: self._show(), names="value")
        super().__init__([self.model, self.tokens, self.cache_dtype,
                          widgets.HBox([self.decode_button, self.stop_button]), self.progress, self.status,
                          self.step, self.readout, self.layers_fig, self.heat_fig,
                          Aria()])  # names the step slider (its description and readout) for a screen reader

    # Running --------------------------------------------------------------------------------------
    def run(self, wait: bool = False) -> None:
        """Decode in a background thread (the button); `wait=True` blocks until it ends. A second press while one
        runs is refused on screen."""
        if self._thread is not None and self._thread.is_alive():
            self.status.value = note_box("A decode is already running; press stop first.")
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_safely, daemon=True)
        self._set_busy(True)
        self._thread.start()
        if wait:
            self._thread.join()

    def stop(self) -> None:
        self._stop.set()

    def _set_busy(self, busy: bool) -> None:
        self.decode_button.disabled = busy
        self.decode_button.description = "decoding…" if busy else "decode and watch the cache fill"
        self.stop_button.disabled = not busy
        for control in (self.model, self.tokens, self.cache_dtype):
            control.disabled = busy

    def _run_safely(self) -> None:
        try:
            self.error, self.status.value = "", ""
            self._decode()
        except Exception as err:  # noqa: BLE001 - the thread must end cleanly and say why on screen
            self.error = describe(err)
            self.status.value = error_box(self.error)
        finally:
            self.progress.value = ""
            self._set_busy(False)

    def _decode(self) -> None:
        arch = self._archs[self.model.value]
        self.plan = plan = fill_plan(arch, self.tokens.value, self.cache_dtype.value)
        self.steps, self.stopped = [], False
        self.progress.value = self._progress_text()
        start = last_draw = time.perf_counter()
        for step, _ in decode_fill(plan):
            self.steps.append(step)
            if len(self.steps) == 1:
                self.build_seconds = time.perf_counter() - start
            if self._stop.is_set():
                self.stopped = True
                break
            if time.perf_counter() - last_draw >= 1 / REDRAWS_PER_S:
                self.progress.value = self._progress_text()
                self._follow()
                last_draw = time.perf_counter()
        self._follow()

    def _progress_text(self) -> str:
        done, total = len(self.steps), self.tokens.value
        if done < 2:
            eta = "building the working model and compiling its step first"
        else:
            per_step = float(np.median([s.seconds for s in self.steps[1:]]))
            eta = f"about {per_step * (total - done):,.0f} s left"
        return f"<div style='color:#555'>decoding: {done:,} of {total:,} tokens; {esc(eta)}</div>"

    def _follow(self) -> None:
        """The slider spans the steps so far and sits on the last; the charts redraw once."""
        if not self.steps:
            return
        with self.hold_sync():
            self.step.disabled = False
            self.step.max = len(self.steps)
            with self.step.hold_trait_notifications():
                self.step.value = len(self.steps)
        self._show()

    # Drawing --------------------------------------------------------------------------------------
    def _show(self) -> None:
        plan, steps = self.plan, self.steps
        if plan is None or not steps:
            return
        s = steps[min(self.step.value, len(steps)) - 1]
        fmt = dantinox.format_bytes
        held, ledger = sum(s.bytes), sum(s.ledger)
        wrong = disagreements(plan, steps)
        per_step = [x.seconds for x in steps[1:]]
        timing = (f"{self.build_seconds:,.1f} s to build and compile, then {1000 * float(np.median(per_step)):,.1f} ms "
                  "per step (median)" if per_step else f"{self.build_seconds:,.1f} s to build and compile")
        rows = [(f"step {s.tokens:,} of {plan.tokens:,}", f"{plan.arch.name}, one sequence, {plan.cache_dtype} cache",
                 badge("measured", "stopped early") if self.stopped else ""),
                ("cache held now", f"{held:,} B = {fmt(held)}", badge("measured", "cache fill × bytes per slot of "
                                                                       "its arrays")),
                ("the ledger at this T", f"{ledger:,} B = {fmt(ledger)}", badge("derived", "kv_ledger formula")),
                ("measured = ledger", "at every step so far" if not wrong else f"no: {wrong[0]}"
                 + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""), ""),
                ("read by this step", fmt(sum(s.read_bytes)),
                 badge("measured", "a shared layer reads its source again, a chunked one its own chunk")),
                (f"allocated for {plan.tokens:,} slots", fmt(plan.total_allocated), badge("measured", "arrays")),
                ("time here", timing, badge("measured", "wall clock"))]
        kinds = "".join(f"<li><b>{esc(label)}</b>: {esc(line)}</li>" for label, line in kind_summary(plan, s))
        self.readout.value = readout_table(rows) + f"<ul>{kinds}</ul>"
        with self.layers_fig.batch_update():
            self.layers_fig.data = []
            for kind in dict.fromkeys(plan.kinds):
                idx = [i for i, k in enumerate(plan.kinds) if k == kind]
                self.layers_fig.add_bar(
                    x=idx, y=[s.bytes[i] for i in idx], name=f"{kind} (measured)",
                    marker_color=KIND_COLOURS.get(kind, "#000"),
                    customdata=[[s.held[i], s.read[i], s.read_bytes[i]] for i in idx],
                    hovertemplate="layer %{x}: %{y:,} B held, %{customdata[0]:,} slots; "
                                  "read %{customdata[1]:,} slots, %{customdata[2]:,} B<extra></extra>")
            self.layers_fig.add_scatter(x=list(range(len(plan.kinds))), y=list(s.ledger), mode="markers",
                                        name="ledger (derived)", marker=dict(symbol="line-ew-open", size=14,
                                                                             color="#000"))
            self.layers_fig.layout.title = dict(
                text=(f"{esc(plan.arch.name)}: bytes each layer holds after {s.tokens:,} tokens<br><sup>bars measured "
                      "(the cache's fill × its arrays' bytes per slot), dashes the ledger (derived)</sup>"),
                x=0, xref="paper", xanchor="left")
        columns = sorted({*np.linspace(0, len(steps) - 1, min(len(steps), HEAT_COLUMNS)).round().astype(int)})
        with self.heat_fig.batch_update():
            self.heat_fig.data = []
            self.heat_fig.add_heatmap(
                x=[steps[c].tokens for c in columns], y=list(range(len(plan.kinds))),
                z=[[steps[c].bytes[i] for c in columns] for i in range(len(plan.kinds))], colorscale="Blues",
                colorbar=dict(title="bytes"),
                customdata=[[plan.kinds[i]] * len(columns) for i in range(len(plan.kinds))],
                hovertemplate="layer %{y} (%{customdata}), step %{x}: %{z:,} B<extra></extra>")
            self.heat_fig.layout.title = dict(
                text=("bytes held per layer as the decode goes (measured)<br><sup>rings stop growing at W, "
                      "shared rows stay 0, state rows are flat from the first token</sup>"),
                x=0, xref="paper", xanchor="left")
