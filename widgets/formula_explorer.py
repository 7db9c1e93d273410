"""The formula explorer: any science item of any entry, one control per variable, driven by the YAML alone.

    explorer = FormulaExplorer(content.load_entry("paged-attention"))
    explorer.set(T=1000, P=16)              # any value in range, used exactly (the slider moves to its nearest stop)
    explorer.reading.result                 # == content.evaluate(entry, item, **explorer.reading.values)
    explorer.load_spec(0)                   # one click: a spec's published inputs into the sliders
    explorer.type_value("T", "32768")       # what typing in the box beside a slider does: T = 32,768 exactly

Each variable's control comes from its range in content (`content.ranges`): a NumberInput (widgets.number_input)
whose slider runs over a linear or log grid that always holds min, max, default and every spec input, in whole
steps for integer variables, or a dropdown of allowed values. The box beside each slider takes a typed number:
inside the range it is used exactly as typed, even between the slider's stops (a standard context length such as
32,768 is not moved to a grid point); outside it, or not a number, it is refused in one line naming the range.
The result is derived: `content.evaluate` of the item, nothing computed here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import traitlets

import content
from content import expr, ranges
from content.units import format_value, number_text, param_text
from widgets._a11y import LIVE, Aria
from widgets._figure import FigureWidget
from widgets._html import badge, error_box, esc
from widgets.number_input import NumberInput

GRID_STEPS = 96  # slider positions over a range; a narrow linear integer range gets every integer
PLOT_POINTS = 96  # points of the result-vs-variable curve
_FORMATS = {"B": "bytes", "s": "seconds"}


@dataclasses.dataclass(frozen=True)
class ExplorerReading:
    """One evaluation: the item, the values substituted, and the result the content formula gives."""

    science: str  # title of the science item
    values: dict[str, int | float]
    result: float  # derived: content.evaluate
    substituted: str  # the compute expression with the numbers in
    result_text: str  # the result as shown, with its unit


def label(value: float) -> str:
    """How a value reads on a slider: 4,096; 0.03; 6.4 × 10⁹."""
    if float(value).is_integer() and abs(value) < 1e7:
        return number_text(value)
    return param_text(value)


def linspace(lo: float, hi: float, n: int) -> list[float]:
    """`n` evenly spaced values from `lo` to `hi`, both ends exact (numpy's linspace, without numpy: the browser
    site runs this module where numpy is not installed)."""
    step = (hi - lo) / (n - 1)
    return [lo + i * step for i in range(n - 1)] + [hi]


def geomspace(lo: float, hi: float, n: int) -> list[float]:
    """`n` values from `lo` to `hi` spaced evenly in log, both ends exact (numpy's geomspace, without numpy)."""
    logs = linspace(math.log10(lo), math.log10(hi), n)
    return [lo] + [10.0 ** x for x in logs[1:-1]] + [hi]


def value_grid(var: Any, extra: tuple[float, ...] = ()) -> list[int | float]:
    """The values a control offers: allowed values, or a grid over the range plus min, max, default and `extra`."""
    if var.values is not None:
        return [ranges.as_number(var, v) for v in var.values]
    lo, hi = var.min, var.max
    integer = ranges.is_integer(var)
    if integer and var.scale != "log" and hi - lo <= 2 * GRID_STEPS:
        points = list(range(int(lo), int(hi) + 1))
    elif var.scale == "log":
        points = geomspace(lo, hi, GRID_STEPS + 1)
    else:
        points = linspace(lo, hi, GRID_STEPS + 1)
    must = [lo, hi, var.default, *(x for x in extra if ranges.contains(var, x))]
    values = {ranges.as_number(var, x) for x in [*points, *must]}
    # neighbours that read the same on the slider are merged; min, max, default and spec inputs are kept
    keep = {ranges.as_number(var, x) for x in must}
    out: dict[str, int | float] = {}
    for v in sorted(values):
        text = label(v)
        if text not in out or v in keep:
            out[text] = v
    return sorted(out.values())


def substitute(compute: str, values: dict[str, float]) -> str:
    """`L * 2 * T` with L=12, T=512 -> `12 × 2 × 512`; function names stay."""
    def one(match: re.Match) -> str:
        name = match.group(0)
        return label(values[name]) if name in values and name not in expr.FUNCTIONS else name
    return re.sub(r"[A-Za-z_][A-Za-z_0-9]*", one, compute).replace("**", "^").replace("*", "×")


def result_text(value: float, unit: str) -> str:
    """The result with its unit; bytes and seconds also in a readable scale (6,291,456 B = 6 MiB)."""
    exact = f"{number_text(value)} {unit}"
    fmt = _FORMATS.get(unit)
    return exact if fmt is None else f"{exact} = {format_value(value, fmt, unit)}"


def read_formula(entry: Any, science: str | int, values: dict[str, float]) -> ExplorerReading:
    """Evaluate one science item at `values` (every variable): a pure function, what the widget shows."""
    item = entry.science_item(science)
    result = content.evaluate(entry, item.title, **values)
    return ExplorerReading(item.title, dict(values), result, substitute(item.compute, values),
                           result_text(result, item.unit))


def curve(entry: Any, science: str | int, values: dict[str, float], x: str) -> tuple[list, list]:
    """The result against variable `x` over its grid, the others held at `values`; None where undefined."""
    item = entry.science_item(science)
    tree = expr.parse(item.compute, set(item.variables))
    grid = value_grid(item.variables[x])
    if len(grid) > PLOT_POINTS:  # evenly over the slider positions, ends included
        grid = [grid[round(i)] for i in linspace(0, len(grid) - 1, PLOT_POINTS)]
    ys: list[float | None] = []
    for v in grid:
        try:
            ys.append(float(expr.evaluate(tree, {**values, x: v})))
        except expr.ExpressionError:
            ys.append(None)  # a gap in the line, e.g. a zero divisor at one end
    return grid, ys


class FormulaExplorer(widgets.VBox):
    """Pick a science item; move a control per variable; read the substituted equation, the result and a plot."""

    reading = traitlets.Instance(ExplorerReading, allow_none=True)
    error = traitlets.Unicode("")

    def __init__(self, entry: Any, science: str | int = 0):
        self.entry = entry
        self._quiet = False
        style = {"description_width": "90px"}
        self.science = widgets.Dropdown(options=[(s.title, i) for i, s in enumerate(entry.science)],
                                        description="formula", style=style, layout=widgets.Layout(width="520px"))
        self.x_axis = widgets.Dropdown(description="plot against", style=style, layout=widgets.Layout(width="320px"))
        self.controls: dict[str, widgets.Widget] = {}
        self.boxes: dict[str, widgets.Text] = {}  # the typed-number box beside each slider
        self.controls_box = widgets.VBox()
        self.specs_box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.formula_html = widgets.HTMLMath()
        self.status_html = widgets.HTML()
        self.figure = FigureWidget(layout=dict(
            height=340, width=680, margin=dict(l=70, r=20, t=50, b=50), showlegend=False,
            hovermode="closest"))
        self.figure.add_traces([go.Scatter(mode="lines", name="formula"),
                                go.Scatter(mode="markers", name="current values",
                                           marker=dict(size=13, color="crimson"))])
        super().__init__([self.science, self.specs_box, self.controls_box, self.status_html, self.formula_html,
                          self.x_axis, self.figure, Aria()])
        self.status_html.add_class(LIVE)
        self.science.observe(lambda _: self._on_science(), names="value")
        self.x_axis.observe(lambda _: self._on_change(), names="value")
        self.select(science)

    @property
    def item(self) -> Any:
        return self.entry.science[self.science.value]

    # Choosing ------------------------------------------------------------------------------------
    def select(self, science: str | int) -> None:
        """Show a science item (title or index); a bad key raises ValueError naming the choices."""
        index = self.entry.science.index(self.entry.science_item(science))
        if index != self.science.value:
            self.science.value = index  # the observer rebuilds the controls
        elif not self.controls:
            self._on_science()

    def _on_science(self) -> None:
        item = self.item
        specs = [(i, s) for i, s in enumerate(self.entry.specs)
                 if s.compute is not None and s.compute.science == item.title]
        self.controls, self.boxes = {}, {}
        rows = []
        for name, var in item.variables.items():
            inputs = tuple(s.compute.with_[name] for _, s in specs)
            description = f"{name} [{var.unit}]"
            tip = f"{name}: {var.meaning} ({ranges.describe(var)} {var.unit})"
            if var.values is not None:
                control = widgets.Dropdown(options=[(label(v), v) for v in value_grid(var)], description=description,
                                           tooltip=tip, style={"description_width": "170px"},
                                           layout=widgets.Layout(width="620px"))
                control.value = ranges.as_number(var, var.default)
                rows.append(control)
            else:  # a slider over the grid and a box that takes any value in range, exactly as typed
                lo, hi = ranges.bounds(var)
                control = NumberInput(value=ranges.as_number(var, var.default), min=ranges.as_number(var, lo),
                                      max=ranges.as_number(var, hi), integer=ranges.is_integer(var),
                                      scale=var.scale or "linear", grid=value_grid(var, inputs),
                                      description=description, name=name, unit=var.unit,
                                      style={"description_width": "170px"},
                                      layout=widgets.Layout(width="520px"), box_width="110px")
                control.slider.tooltip = tip
                control.box.tooltip = f"type a value for {name} ({ranges.describe(var)} {var.unit}) and press Enter"
                control.observe(lambda change: self._typed_error(change["new"]), names="error")
                self.boxes[name] = control.box
                rows.append(control)
            control.observe(lambda _: self._on_change(), names="value")
            self.controls[name] = control
        buttons = []
        for i, spec in specs:
            button = widgets.Button(description=f"load: {spec.label}", tooltip=spec.context,
                                    layout=widgets.Layout(width="auto", max_width="640px"))
            button.on_click(lambda _, i=i: self._guard(lambda: self.load_spec(i)))
            buttons.append(button)
        with self.hold_sync():
            legend = "".join(f"<li><code>{esc(n)}</code>: {esc(v.meaning)} ({esc(ranges.describe(v))} "
                             f"{esc(v.unit)})</li>" for n, v in item.variables.items())
            self.controls_box.children = [*rows,
                                          widgets.HTML(f"<ul style='margin:2px 0;font-size:90%'>{legend}</ul>")]
            self.specs_box.children = buttons
            self._quiet = True
            self.x_axis.options = [(f"{n}: {v.meaning}", n) for n, v in item.variables.items()]
            self.x_axis.value = next(iter(item.variables))
            self._quiet = False
        self.refresh()

    # Setting values ------------------------------------------------------------------------------
    def set(self, **values: float) -> ExplorerReading | None:
        """Set some variables at once (one refresh), each used exactly; a value its control does not take (out
        of range, not whole where the variable is, not one of a dropdown's values) raises ValueError."""
        for name, value in values.items():
            if name not in self.controls:
                raise ValueError(f"{name}: expected a variable of {self.item.title!r} "
                                 f"({', '.join(self.controls)}), got {name!r}")
            var, control = self.item.variables[name], self.controls[name]
            if isinstance(control, NumberInput):
                try:
                    control.validate(value)
                except ValueError:
                    raise ValueError(f"{name}: expected a value the control takes ({control.range_text()}), "
                                     f"got {value!r}") from None
            elif isinstance(value, bool) or value not in [v for _, v in control.options]:
                raise ValueError(f"{name}: expected a value the control offers ({ranges.describe(var)}), "
                                 f"got {value!r}")
        self._quiet = True
        try:
            with self.hold_sync():
                for name, value in values.items():
                    self.controls[name].value = value
        finally:
            self._quiet = False
        return self.refresh()

    def type_value(self, name: str, text: str) -> ExplorerReading | None:
        """What typing `text` in the box beside `name`'s slider and pressing Enter does: the value is used
        exactly as typed (the slider moves to its nearest stop), or refused with a ValueError naming the range."""
        if name not in self.boxes:
            raise ValueError(f"{name}: expected a slider variable of {self.item.title!r} "
                             f"({', '.join(self.boxes)}), got {name!r}")
        control = self.controls[name]
        if not control.type(text):
            raise ValueError(control.message)
        return self.reading

    def _typed_error(self, message: str) -> None:
        """A box refused a typed value: the explorer's status line and `error` say so (the box's line too)."""
        if message:
            self.error = message
            self.status_html.value = error_box(message)

    def load_spec(self, index: int) -> ExplorerReading | None:
        """Load the inputs of spec `index` (one computed by a science item) into the controls."""
        specs = self.entry.specs
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs) or \
                specs[index].compute is None:
            computed = [i for i, s in enumerate(specs) if s.compute is not None]
            raise ValueError(f"index: expected a computed spec of {self.entry.id!r} ({computed}), got {index!r}")
        spec = specs[index]
        self.select(spec.compute.science)
        return self.set(**spec.compute.with_)

    @property
    def values(self) -> dict[str, int | float]:
        """The value of every variable of the current item, as the controls hold them."""
        return {name: control.value for name, control in self.controls.items()}

    # Drawing -------------------------------------------------------------------------------------
    def _on_change(self) -> None:
        if not self._quiet:
            self.refresh()

    def _guard(self, fn) -> None:
        try:
            fn()
        except ValueError as err:
            self.error = str(err)
            self.status_html.value = error_box(self.error)

    def refresh(self) -> ExplorerReading | None:
        """Evaluate and redraw; a content error is shown and kept in `.error`, never hidden."""
        item = self.item
        try:
            reading = read_formula(self.entry, self.science.value, self.values)
            xs, ys = curve(self.entry, self.science.value, reading.values, self.x_axis.value)
        except (ValueError, content.ContentError) as err:
            self.error = str(err)
            self.status_html.value = error_box(self.error)
            return None
        self.error = ""
        self.status_html.value = ""
        x = self.x_axis.value
        xvar = item.variables[x]
        self.formula_html.value = (
            f"<b>{esc(item.title)}</b> {badge('derived', 'content formula')}"
            f"<div>$${esc(item.equation)}$$</div>"
            f"<div style='font-family:monospace'>= {esc(reading.substituted)}</div>"
            f"<div style='font-size:120%'><b>= {esc(reading.result_text)}</b></div>")
        finite = [y for y in ys if y is not None]
        log_y = bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 1e3
        with self.figure.batch_update():
            line, point = self.figure.data
            unit = esc(item.unit)  # plotly renders a subset of HTML in its text: content is escaped for it too
            line.update(x=xs, y=ys, hovertemplate=f"{x}=%{{x}}<br>%{{y:,.4g}} {unit}<extra>derived</extra>")
            point.update(x=[reading.values[x]], y=[reading.result],
                         hovertemplate=f"current: {x}=%{{x}}<br>%{{y:,.4g}} {unit}<extra></extra>")
            layout = self.figure.layout
            layout.xaxis.update(title=f"{x} [{esc(xvar.unit)}]", type="log" if xvar.scale == "log" else "linear")
            layout.yaxis.update(title=f"{esc(item.title)} [{unit}]", type="log" if log_y else "linear")
            layout.title.text = (f"{esc(item.title)} vs {x}, other variables as set<br><sup>derived from the "
                                 f"content formula · dot: your current values</sup>")
        self.reading = reading
        return reading
