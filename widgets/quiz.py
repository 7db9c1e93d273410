"""The quiz: an entry's checks, graded by the content API, with feedback, a score and a record of answers.

    quiz = Quiz(entry, params=lab.formula_params, lab_checks=[0])   # check 0 can take the lab's numbers
    quiz.answer(0, 6.0)                               # what typing 6 and pressing "check" does
    quiz.score, quiz.records, quiz.to_json()

Numeric answers are computed from the entry's science items (never typed in content) and accepted
within the check's relative tolerance. The score counts first attempts; every attempt is recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

import content
from widgets._html import error_box, esc

RIGHT, WRONG = "#1b5e20", "#b71c1c"
# ipywidgets gives each radio label one line's fixed height and floats its input, so a long option overlaps
# the next one: let the label grow, keep the input first (it follows the text in the DOM) and wrap beside it.
WRAP_OPTIONS_CSS = ("<style>.dx-quiz .widget-radio-box label{height:auto;display:flex;flex-direction:row-reverse;"
                    "justify-content:flex-end;align-items:flex-start;line-height:1.4;padding:1px 0}"
                    ".dx-quiz .widget-radio-box input{flex:none;float:none}</style>")


def _number_text(value: float) -> str:
    return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:,.0f}"


def parse_number(text: str, unit: str) -> float:
    """A learner's typed number: commas and the unit are allowed ('6,291,456 B'); anything else is refused."""
    cleaned = text.strip().replace(",", "").replace("_", "")
    if unit and cleaned.endswith(unit):
        cleaned = cleaned[: -len(unit)].strip()
    try:
        return float(cleaned)
    except ValueError:
        raise ValueError(f"answer: expected a number in {unit}, got {text!r}") from None


class Quiz(widgets.VBox):
    """Choice and numeric checks of one entry.

    `params` (optional) returns the lab's current values; the numeric checks listed in `lab_checks` take
    the names they share with it when the learner asks for "numbers from my lab settings". Only generic
    questions belong there: a question about a named model must keep that model's numbers.
    """

    def __init__(self, entry: Any, params: Callable[[], dict[str, float]] | None = None,
                 lab_checks: tuple[int, ...] | list[int] = (), learner: str = ""):
        self.entry = entry
        self.params_source = params
        for i in lab_checks:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(entry.checks) or \
                    entry.checks[i].kind != "numeric":
                raise ValueError(f"lab_checks: expected indices of numeric checks of {entry.id!r}, got {i!r}")
        if lab_checks and params is None:
            raise ValueError("lab_checks: given without params; pass params=lab.formula_params")
        self.lab_checks = tuple(lab_checks)
        self.learner = learner
        self.records: list[dict[str, Any]] = []
        self.first_try: dict[int, bool] = {}  # check index -> whether its first answer was right
        self.shown_params: dict[int, dict[str, float]] = {}  # numeric check -> params its question shows
        self.questions: list[widgets.HTML] = []
        self.inputs: list[widgets.Widget] = []
        self.feedback: list[widgets.HTML] = []
        self.score_html = widgets.HTML()
        boxes = []
        for i, check in enumerate(entry.checks):
            self.questions.append(widgets.HTML())
            if check.kind == "choice":
                field = widgets.RadioButtons(options=[(text, j) for j, text in enumerate(check.options)],
                                             value=None, layout=widgets.Layout(width="auto"))
            else:
                field = widgets.Text(placeholder=f"your answer in {check.unit}",
                                     description=check.unit, layout=widgets.Layout(width="320px"))
            button = widgets.Button(description="check", layout=widgets.Layout(width="90px"))
            button.on_click(lambda _, i=i: self._submit(i))
            self.inputs.append(field)
            self.feedback.append(widgets.HTML())
            boxes.append(widgets.VBox([self.questions[i], widgets.HBox([field, button]), self.feedback[i]],
                                      layout=widgets.Layout(border_bottom="1px solid #eee", padding="4px 0")))
        extra = []
        if self.lab_checks:
            use_lab = widgets.Button(description="numbers from my lab settings", icon="refresh",
                                     layout=widgets.Layout(width="260px"))
            use_lab.on_click(lambda _: self.use_params(self.params_source()))
            extra.append(use_lab)
        self.export_button = widgets.Button(description="show my answers (JSON)", layout=widgets.Layout(width="220px"))
        self.export_area = widgets.Textarea(layout=widgets.Layout(width="100%", height="120px", display="none"))
        self.export_button.on_click(lambda _: self._show_export())
        self.use_params(None)
        super().__init__([*boxes, self.score_html, widgets.HBox([*extra, self.export_button]), self.export_area,
                          widgets.HTML(WRAP_OPTIONS_CSS)])
        self.add_class("dx-quiz")

    # Questions -------------------------------------------------------------------------------------
    def use_params(self, params: dict[str, float] | None) -> None:
        """Show the lab checks with `params` (each takes the names it has); None: the entry's own numbers."""
        for i, check in enumerate(self.entry.checks):
            if check.kind == "numeric":
                given = params if i in self.lab_checks else None
                own = {k: v for k, v in (given or {}).items() if k in check.params}
                self.shown_params[i] = own
                text = content.render_question(self.entry, i, own or None)
                if own:
                    text += " (numbers from your lab settings)"
            else:
                text = check.question
            self.questions[i].value = f"<b>Q{i + 1}.</b> {esc(text)}"
            if i in self.lab_checks:  # its numbers changed: feedback on the old ones would mislead
                self.feedback[i].value = ""
        self._show_score()

    # Answers ---------------------------------------------------------------------------------------
    def answer(self, index: int, response: Any) -> bool:
        """Grade `response` for check `index` (an option index, or a number in the check's unit), record it,
        and show feedback with the explanation. Bad input raises ValueError (the widget shows it)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.entry.checks):
            raise ValueError(f"index: expected 0 to {len(self.entry.checks) - 1}, got {index!r}")
        check = self.entry.checks[index]
        record: dict[str, Any] = {"entry": self.entry.id, "check": index, "kind": check.kind,
                                  "learner": self.learner, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if check.kind == "choice":
            if isinstance(response, bool) or not isinstance(response, int) or \
                    not 0 <= response < len(check.options):
                raise ValueError(f"answer: expected an option index 0 to {len(check.options) - 1}, got {response!r}")
            correct = content.is_correct(self.entry, index, response)
            verdict = "Correct." if correct else "Not quite."
            note = check.feedback[response] if check.feedback else ""
            if note.startswith(verdict):  # content often opens the right option's note with "Correct."
                note = note[len(verdict):].strip()
            lines = [verdict, note] if note else [verdict]
            record.update(question=check.question, response=response, expected=check.answer)
        else:
            if isinstance(response, str):
                response = parse_number(response, check.unit)
            if isinstance(response, bool) or not isinstance(response, int | float):
                raise ValueError(f"answer: expected a number in {check.unit}, got {response!r}")
            params = self.shown_params.get(index) or None
            expected = content.check_answer(self.entry, index, params)
            correct = content.is_correct(self.entry, index, response, params)
            tol = f"±{check.tolerance:.0%}"
            lines = [f"Correct: {_number_text(expected)} {check.unit} (accepted within {tol})." if correct else
                     f"Not quite: the formula gives {_number_text(expected)} {check.unit}; you answered "
                     f"{_number_text(response)} (accepted within {tol})."]
            record.update(question=content.render_question(self.entry, index, params), response=response,
                          expected=expected, params=params or dict(check.params), tolerance=check.tolerance)
        record["correct"] = bool(correct)
        record["attempt"] = sum(r["check"] == index for r in self.records) + 1
        self.records.append(record)
        self.first_try.setdefault(index, bool(correct))
        colour = RIGHT if correct else WRONG
        self.feedback[index].value = (f"<div style='color:{colour}'>{'<br>'.join(esc(x) for x in lines)}</div>"
                                      f"<div style='color:#444'><i>Why:</i> {esc(check.explanation)}</div>")
        self._show_score()
        return bool(correct)

    def _submit(self, index: int) -> None:
        field = self.inputs[index]
        try:
            if field.value is None or field.value == "":
                raise ValueError("answer: choose an option or type a number first")
            self.answer(index, field.value)
        except ValueError as err:
            self.feedback[index].value = error_box(str(err))

    # Score and export ------------------------------------------------------------------------------
    @property
    def score(self) -> int:
        """Checks answered right on the first attempt."""
        return sum(self.first_try.values())

    def _show_score(self) -> None:
        n = len(self.entry.checks)
        self.score_html.value = (f"<b>Score: {self.score} / {n}</b> (first attempts; {len(self.first_try)} of {n} "
                                 f"answered)")

    def to_json(self) -> str:
        """Every attempt, as JSON: what an instructor collects and feeds to `summarise`."""
        return json.dumps(self.records, indent=1)

    def _show_export(self) -> None:
        self.export_area.value = self.to_json()
        self.export_area.layout.display = None


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per check, over any number of learners' records: learners, attempts, and first-attempt success rate."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault((r["entry"], r["check"]), {"entry": r["entry"], "check": r["check"], "learners": 0,
                                                          "attempts": 0, "first_try_right": 0})
        row["attempts"] += 1
        if r["attempt"] == 1:
            row["learners"] += 1
            row["first_try_right"] += bool(r["correct"])
    out = []
    for row in sorted(rows.values(), key=lambda x: (x["entry"], x["check"])):
        row["first_try_rate"] = row["first_try_right"] / row["learners"] if row["learners"] else float("nan")
        out.append(row)
    return out
