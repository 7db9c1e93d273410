"""What every lab widget shares: batched control changes, checked programmatic values, errors on screen.

A lab subclasses `Lab`, lists its controls in `CONTROLS`, and implements `_read()` (compute, may raise) and
`_render(result)` (draw). Moving any control, or `lab.update(a=..., b=...)`, recomputes once; the result is
stored in the trait named by `RESULT` and any error in the `error` trait and the lab's status line.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import ipywidgets as widgets
import traitlets

from widgets._a11y import LIVE, Aria
from widgets._html import error_box, note_box
from widgets.number_input import NumberInput


class Stopped(Exception):  # noqa: N818 - a learner's stop, not an error
    """A long run stopped by the learner's stop button: not an error, `Lab.refresh` lets the lab handle it."""


def describe(err: Exception) -> str:
    """One line for the learner: a ValueError's own message (it names the field), else the type too."""
    return str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"


def check_value(control: widgets.Widget, value: Any, name: str) -> None:
    """Refuse what the control would clamp or reject, in one line naming the control and its range."""
    if isinstance(control, NumberInput):  # any value in range, off the slider's stops too
        m, kind = control.multiple_of, "an integer" if control.integer else "a number"
        number = isinstance(value, int) if control.integer else isinstance(value, int | float)
        if isinstance(value, bool) or not number or not control.min <= value <= control.max or (m != 1 and value % m):
            steps = f" in steps of {m}" if m != 1 else ""
            raise ValueError(f"{name}: expected {kind} in [{control.min}, {control.max}]{steps}, got {value!r}")
        if control.check is not None:
            control.check(value)
    elif isinstance(control, widgets.IntSlider):
        step = control.step or 1
        if isinstance(value, bool) or not isinstance(value, int) or not control.min <= value <= control.max \
                or (value - control.min) % step:
            steps = f" in steps of {step}" if step != 1 else ""
            raise ValueError(f"{name}: expected an integer in [{control.min}, {control.max}]{steps}, got {value!r}")
    elif isinstance(control, widgets.FloatSlider):
        if isinstance(value, bool) or not isinstance(value, int | float) or not control.min <= value <= control.max:
            raise ValueError(f"{name}: expected a number in [{control.min}, {control.max}], got {value!r}")
    else:
        values = [o[1] if isinstance(o, tuple) else o for o in control.options]  # (label, value) pairs too
        if value not in values:
            raise ValueError(f"{name}: expected one of {', '.join(map(str, values))}, got {value!r}")


class Lab(widgets.VBox):
    """Base of the lab widgets: one refresh per change or per `update(...)`, errors kept and shown."""

    CONTROLS: tuple[str, ...] = ()  # attribute names of the controls `update` may set, in the order it sets them
    # What a refresh does, for a lab where one can take a second or more (a new shape traced and compiled, arrays
    # allocated): a refresh still running after WORKING_AFTER_S then shows `working`'s state. "": never.
    WORKING = ""
    WORKING_AFTER_S = 0.5
    RESULT = "reading"  # the trait each refresh stores its result in
    error = traitlets.Unicode("")  # the last refresh's error, "" after a good one

    _quiet = False

    def __init__(self, children: list[widgets.Widget], status: widgets.HTML):
        self.status_html = status
        status.add_class(LIVE)  # an error or a refusal is read out when it appears
        super().__init__([*children, Aria()])  # names the plain sliders (NumberInputs name their own)

    @contextlib.contextmanager
    def batched(self):
        """Change several controls with one refresh (observers hold off) and one message to the browser."""
        quiet, self._quiet = self._quiet, True
        try:
            with self.hold_sync():
                yield
        finally:
            self._quiet = quiet

    @contextlib.contextmanager
    def working(self, note: str, *controls: widgets.Widget, after: float = 0.0):
        """For work of a second or more: `controls` disabled (a move made meanwhile would queue a second run
        behind it) and "working… `note`" in the status line, a live region; each control's own disabled state
        comes back after, and the status line too unless the work wrote its own. With `after` > 0 the state
        shows only once the work has run that long (from a timer thread: the kernel sends it while the work
        holds the main thread), so work served from a cache never flickers."""
        lock, done, shown = threading.Lock(), [], []
        busy = note_box(f"working… {note}")

        def show() -> None:
            with lock:
                if done:
                    return
                shown.append(([control.disabled for control in controls], self.status_html.value))
                for control in controls:
                    control.disabled = True
                self.status_html.value = busy

        timer = threading.Timer(after, show) if after > 0 else None
        if timer is None:
            show()
        else:
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            with lock:
                done.append(True)
                if shown:
                    was, status = shown[0]
                    for control, disabled in zip(controls, was, strict=True):
                        control.disabled = disabled
                    if self.status_html.value == busy:
                        self.status_html.value = status

    def observe_controls(self, *controls: widgets.Widget) -> None:
        for control in controls:
            control.observe(self._on_change, names="value")

    def _on_change(self, _change=None) -> None:
        if not self._quiet:
            self.refresh()

    def update(self, **values: Any) -> Any:
        """Set several controls at once (one refresh); out-of-range values raise instead of clamping.

        A value of None leaves that control as it is (e.g. `kv_heads=None`: the variant's default choice).
        """
        unknown = sorted(set(values) - set(self.CONTROLS))
        if unknown:
            raise ValueError(f"update: unknown control(s) {', '.join(unknown)}; expected {', '.join(self.CONTROLS)}")
        with self.batched():
            for name in self.CONTROLS:
                if name in values and values[name] is not None:
                    self._set(name, values[name])
        return self.refresh()

    def _set(self, name: str, value: Any) -> None:
        control = getattr(self, name)
        check_value(control, value, name)
        control.value = value

    def refresh(self) -> Any:
        """Recompute and redraw; an error is shown in the lab and kept in `.error`, never hidden. A lab with a
        WORKING note says it is working, its controls disabled, while a slow refresh runs."""
        if not self.WORKING:
            return self._refresh()
        with self.working(self.WORKING, *(getattr(self, name) for name in self.CONTROLS),
                          after=self.WORKING_AFTER_S):
            return self._refresh()

    def _refresh(self) -> Any:
        try:
            result = self._read()
        except Stopped:
            raise
        except Exception as err:  # noqa: BLE001 - shown on screen; the lab must survive any setting
            self.error = describe(err)
            self.status_html.value = error_box(self.error)
            return None
        self.error = ""
        setattr(self, self.RESULT, result)  # first, so views the render triggers read the new result
        with self.hold_sync():
            self._render(result)
        return result

    def guard(self, fn) -> None:
        """Run a view-only callback (no recompute); its error goes where a refresh's would."""
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - any failure must be visible to the learner
            self.error = describe(err)
            self.status_html.value = error_box(self.error)

    def _read(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define _read")

    def _render(self, result: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _render")
