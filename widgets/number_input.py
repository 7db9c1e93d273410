"""The one control for a number a learner may slide or type: every typed value is taken or refused in one line.

    tokens = NumberInput(value=32_768, min=1, max=131_072, scale="log", description="tokens T", unit="tokens")
    tokens.type("100,000")   # taken exactly: tokens.value == 100_000, the slider at its nearest stop
    tokens.type("200000")    # refused: tokens.message names the range, tokens.value unchanged
    tokens.type("2,91")      # refused: a comma only groups thousands (content.units.parse_number)
    tokens.value = 4096      # what code sets is checked the same way (out of range raises ValueError)

Rules, the same in every lab:
- `value` is the number the formula uses, exactly as typed or set; the slider is a way to reach its stops and
  moves to the stop nearest `value` (by ratio on a log scale); the box shows `value` itself.
- A typed value outside [min, max], not a number, not whole where the control is whole, or refused by the
  lab's `check` leaves `value` unchanged and says why, with the range, in the control's one line (`message`).
- A decimal comma is refused, never read as a thousands separator: '2,91' is not 291 (and not 2.91).
- Narrowing the range (a new model's context) moves an outside value to the nearest end and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import traitlets

from content.units import number_text, parse_number
from widgets._a11y import LIVE
from widgets._html import esc

MAX_STOPS = 200  # slider positions over a wide range; every whole number when the range is narrower


def text(value: float) -> str:
    """How a value reads in the box: 131,072; 0.9; 2.5."""
    return number_text(value) if float(value).is_integer() else f"{value:g}"


def stops(lo: float, hi: float, *, integer: bool, scale: str = "linear", step: float | None = None,
          n: int = MAX_STOPS) -> list[int | float]:
    """The slider's stops over [lo, hi], both ends included: every `step` (or whole number) when there are at
    most `n`, else `n` evenly spaced (in log for scale='log')."""
    if step is not None and (hi - lo) / step <= n:
        count = int(math.floor((hi - lo) / step + 1e-9))
        points = [lo + i * step for i in range(count + 1)]
    elif integer and scale != "log" and hi - lo <= n:
        points = list(range(int(lo), int(hi) + 1))
    elif scale == "log":
        a, b = math.log(lo), math.log(hi)
        points = [math.exp(a + (b - a) * i / n) for i in range(n + 1)]
    else:
        points = [lo + (hi - lo) * i / n for i in range(n + 1)]
    if integer:
        points = [round(p) for p in points]
    else:
        points = [round(p, 12) for p in points]
    return sorted({*points, lo, hi})


class NumberInput(widgets.HBox):
    """A slider over stops, a box showing the exact value, and one line that says what happened to a typed value."""

    value = traitlets.Any()  # the exact number the lab's formula uses
    min = traitlets.Any()
    max = traitlets.Any()
    message = traitlets.Unicode("")  # the control's one line: what a typed value did, or why it was refused
    error = traitlets.Unicode("")  # the last typed value's refusal, "" once a value is taken (a lab may mirror it)
    disabled = traitlets.Bool(False)

    def __init__(self, value: float, min: float, max: float, *, description: str = "", unit: str = "",  # noqa: A002
                 integer: bool = True, scale: str = "linear", step: float | None = None, multiple_of: int = 1,
                 grid: list[float] | tuple[float, ...] | None = None,
                 check: Callable[[Any], None] | None = None, continuous_update: bool = True,
                 style: dict | None = None, layout: widgets.Layout | None = None, box_width: str = "100px",
                 name: str | None = None):
        if scale not in ("linear", "log"):
            raise ValueError(f"scale: expected 'linear' or 'log', got {scale!r}")
        if scale == "log" and min <= 0:
            raise ValueError(f"min: a log scale needs min > 0, got {min!r}")
        self.name = name or description.split(" (")[0] or "value"  # the line's subject: 'tokens T (log)' -> 'tokens T'
        self.unit, self.integer, self.scale, self.grid = unit, integer, scale, grid
        self.multiple_of = multiple_of  # a rule of the quantity (RoPE pairs, the mesh's data axis), not of the grid
        self.step = step if step is not None or multiple_of == 1 else multiple_of
        self.check = check  # the lab's own rule (e.g. 'must divide the generation length'): raises ValueError
        self._syncing = self._ranging = False
        self.slider = widgets.SelectionSlider(options=[("0", 0)], description=description, readout=False,
                                              continuous_update=continuous_update, style=style or {},
                                              layout=layout or widgets.Layout(width="480px"))
        self.box = widgets.Text(continuous_update=False, layout=widgets.Layout(width=box_width))
        self.note = widgets.HTML()
        self.note.add_class(LIVE)  # "taken" or "refused, the range is ..." is read out
        self.box.tooltip = self.box_name()  # a screen reader's name for the box (widgets._a11y.Aria applies it)
        super().__init__([self.slider, self.box, self.note],  # a long line wraps below, never off screen
                         layout=widgets.Layout(align_items="center", flex_flow="row wrap"))
        with self.hold_trait_notifications():
            self.set_trait("min", min)
            self.set_trait("max", max)
            self.validate(value)
            self.set_trait("value", value)
        self._restop()
        self._show()
        self.slider.observe(self._on_slider, names="value")
        self.box.observe(self._on_box, names="value")
        self.observe(self._on_value, names="value")
        self.observe(self._on_range, names=["min", "max"])
        self.observe(self._on_message, names="message")
        self.observe(self._on_disabled, names="disabled")

    # What a learner does ------------------------------------------------------------------------
    def type(self, typed: str) -> bool:
        """What typing `typed` in the box and pressing Enter does: True if taken (value == the number typed),
        False if refused (value unchanged, `message` says why and gives the range)."""
        try:
            number = parse_number(typed)
        except ValueError:
            comma = " (use a decimal point (2.91); a comma only groups thousands: 4,096)" if "," in typed else ""
            return self._refuse(f"{self.name}: expected {self.range_text()}, got {typed.strip()[:40]!r}{comma}")
        if self.integer and float(number).is_integer():
            number = int(number)
        try:
            self.validate(number)
        except ValueError as err:
            return self._refuse(str(err))
        self.error = ""
        if number == self.value:
            self.message = f"{self.name} = {text(number)} {self.unit}".rstrip() + " (unchanged)"
            self._show()
            return True
        self.value = number
        stop = self.slider.value
        where = "" if stop == number else f"; the slider shows the nearest stop, {text(stop)}"
        self.message = f"{self.name} = {text(number)} {self.unit}".rstrip() + f", as typed{where}"
        return True

    # What a screen reader says ------------------------------------------------------------------
    def handle_name(self) -> str:
        """The slider handle's accessible name: 'tokens T, 512 tokens'."""
        return f"{self.name}, {text(self.value)} {self.unit}".rstrip()

    def box_name(self) -> str:
        """The text box's accessible name: 'tokens T in tokens, typed'."""
        return f"{self.name}" + (f" in {self.unit}" if self.unit else "") + ", typed"

    # Checking -----------------------------------------------------------------------------------
    def range_text(self) -> str:
        whole = "a whole number" if self.integer else "a number"
        unit = f" {self.unit}" if self.unit else ""
        steps = f" in steps of {self.multiple_of}" if self.multiple_of != 1 else ""
        return f"{whole} from {text(self.min)} to {text(self.max)}{unit}{steps}"

    def validate(self, number: Any) -> None:
        """ValueError naming the range (or the lab's rule) unless `number` is one this control takes."""
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
            raise ValueError(f"{self.name}: expected {self.range_text()}, got {number!r}")
        if self.integer and not float(number).is_integer():
            raise ValueError(f"{self.name}: expected {self.range_text()}, got {text(number)}")
        if not self.min <= number <= self.max or (self.multiple_of != 1 and number % self.multiple_of):
            raise ValueError(f"{self.name}: expected {self.range_text()}, got {text(number)}")
        if self.check is not None:
            self.check(number)

    def _refuse(self, why: str) -> bool:
        self.message = f"{why}; kept {text(self.value)}" if not why.endswith(f"kept {text(self.value)}") else why
        self._show()  # the refused text must not stay in the box as if it were used
        self.error = self.message
        return False

    @traitlets.validate("value")
    def _valid_value(self, proposal):
        number = proposal["value"]
        if self.integer and isinstance(number, float) and number.is_integer():
            number = int(number)
        try:
            self.validate(number)
        except ValueError as err:
            raise traitlets.TraitError(str(err)) from None
        return number

    # Keeping the parts in step ------------------------------------------------------------------
    def _restop(self) -> None:
        lo, hi = self.min, self.max
        points = [p for p in self.grid if lo <= p <= hi] if self.grid is not None else \
            stops(lo, hi, integer=self.integer, scale=self.scale, step=self.step)
        points = sorted({*points, lo, hi})
        self._syncing = True
        try:
            self.slider.options = [(text(p), p) for p in points]
        finally:
            self._syncing = False

    def nearest_stop(self, number: float) -> int | float:
        points = [v for _, v in self.slider.options]
        if self.scale == "log" and number > 0:
            return min(points, key=lambda p: abs(math.log(p / number)))
        return min(points, key=lambda p: abs(p - number))

    def _show(self) -> None:
        """The slider at the stop nearest `value`, the box showing `value` exactly."""
        self._syncing = True
        try:
            self.slider.value = self.nearest_stop(self.value)
            self.box.value = text(self.value)
            self.slider.tooltip = self.handle_name()  # the handle's name, with the value and unit; shown on hover
        finally:
            self._syncing = False

    def _on_slider(self, change) -> None:
        if not self._syncing:
            self.message = self.error = ""
            self.value = change["new"]

    def _on_box(self, change) -> None:
        if not self._syncing and change["new"].strip() != text(self.value):
            self.type(change["new"])

    def _on_value(self, _change) -> None:
        if self.message and not self.message.startswith(f"{self.name} = {text(self.value)}"):
            self.message = ""  # a note about an earlier value would now mislead
        self._show()

    def set_grid(self, grid: list[float] | tuple[float, ...] | None) -> None:
        """New slider stops (None: evenly spaced); the value stays as it is."""
        self.grid = grid
        self._restop()
        self._show()

    def set_range(self, lo: float, hi: float, *, multiple_of: int | None = None, value: float | None = None) -> None:
        """A new range (and rule of multiples) at once; `value` (else the current one, moved to the nearest end
        when outside, said in the line) is checked against the new rule."""
        old = self.value
        self._ranging = True
        try:
            if multiple_of is not None:
                self.multiple_of, self.step = multiple_of, (multiple_of if multiple_of != 1 else None)
            self.set_trait("min", lo)
            self.set_trait("max", hi)
        finally:
            self._ranging = False
        self._restop()
        new = old if value is None else value
        moved = value is None and not lo <= old <= hi
        if moved:
            new = lo if old < lo else hi
        self.value = new
        if moved:
            self.message = (f"{self.name} moved from {text(old)} to {text(new)}: the range is now {text(lo)} to "
                            f"{text(hi)}")
        self._show()

    def _on_range(self, _change) -> None:
        if self.min > self.max or self._ranging:
            return  # the other end follows in the same update
        old = self.value
        self._restop()
        if not self.min <= old <= self.max:
            new = self.min if old < self.min else self.max
            with self.hold_trait_notifications():
                self.set_trait("value", new)
            self.message = (f"{self.name} moved from {text(old)} to {text(new)}: the range is now "
                            f"{text(self.min)} to {text(self.max)}")
        self._show()

    def _on_message(self, change) -> None:
        self.note.value = (f"<span style='font-size:90%;color:#5d4037'>{esc(change['new'])}</span>"
                           if change["new"] else "")

    def _on_disabled(self, change) -> None:
        self.slider.disabled = self.box.disabled = change["new"]

    @property
    def description(self) -> str:
        return self.slider.description

    @property
    def from_browser(self) -> bool:
        """True while a change sent by the front end (a slider move, a typed value) is being applied."""
        return bool(self.slider._property_lock or self.box._property_lock)
