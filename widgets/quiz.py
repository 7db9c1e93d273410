"""The quiz: an entry's checks, graded by the content API, with feedback, a score and a record of answers.

    quiz = Quiz(entry, params=lab.formula_params, lab_checks=[0])   # check 0 can take the lab's numbers
    quiz.answer(0, 6.0)                               # what typing 6 and pressing "check" does
    quiz.score, quiz.attempts, quiz.to_json()

Numeric answers are computed from the entry's science items (never typed in content) and accepted
within the check's relative tolerance; each numeric question says which answers that accepts (from ... to
...), so what it asks and how it grades agree. Typed numbers may carry commas, the unit or a fraction (1/8).
The score counts first attempts. Every attempt is written, as it
happens, to the answer store (`classroom.store`, $DANTINOX_ANSWERS_DB or the user's data directory), so
reopening the lab shows earlier answers and score; "reset my answers" starts the entry over. Inside a
JupyterHub server with the classroom service configured, each attempt is also sent to that service, from a
background thread (`classroom.client.BackgroundDelivery`): a click never waits on the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

import content
from classroom.grading import parse_number
from classroom.store import AnswerStore, Attempt, current_learner, new_key
from classroom.summary import question_rows
from widgets._a11y import LIVE, QUESTION, Aria
from widgets._html import error_box, esc
from widgets.answer_text import DESKTOP_EXPORT_HINT, RIGHT, WRONG, accepted_text, answers_table, number_text

# ipywidgets gives each radio label one line's fixed height and floats its input, so a long option overlaps
# the next one: let the label grow, keep the input first (it follows the text in the DOM) and wrap beside it.
WRAP_OPTIONS_CSS = ("<style>.dx-quiz .widget-radio-box label{height:auto;display:flex;flex-direction:row-reverse;"
                    "justify-content:flex-end;align-items:flex-start;line-height:1.4;padding:1px 0}"
                    ".dx-quiz .widget-radio-box input{flex:none;float:none}</style>")


class Quiz(widgets.VBox):
    """Choice and numeric checks of one entry.

    `params` (optional) returns the lab's current values; the numeric checks listed in `lab_checks` take
    the names they share with it when the learner asks for "numbers from my lab settings". Only generic
    questions belong there: a question about a named model must keep that model's numbers.
    """

    def __init__(self, entry: Any, params: Callable[[], dict[str, float]] | None = None,
                 lab_checks: tuple[int, ...] | list[int] = (), learner: str | None = None,
                 store: AnswerStore | None = None):
        self.entry = entry
        self.params_source = params
        for i in lab_checks:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(entry.checks) or \
                    entry.checks[i].kind != "numeric":
                raise ValueError(f"lab_checks: expected indices of numeric checks of {entry.id!r}, got {i!r}")
        if lab_checks and params is None:
            raise ValueError("lab_checks: given without params; pass params=lab.formula_params")
        self.lab_checks = tuple(lab_checks)
        self.learner = learner or current_learner()
        self.content_version = _content_version(entry)
        self.status = widgets.HTML()  # where store and delivery problems show; the quiz keeps working
        self.status.add_class(LIVE)
        self._unsaved: str | None = None  # why the last answer is in no store, while that is so
        self.store = store
        if store is None and sys.platform == "emscripten":  # the browser site: the page's own storage
            from widgets.browser_store import browser_store

            self.store = browser_store()
            self.store.on_load(self._stored_arrived)
            self.store.observe(self._storage_error, names="error")
        elif store is None:
            try:
                self.store = AnswerStore()
            except ValueError as err:
                self._unsaved = str(err)
                self.status.value = error_box(f"{err}; answers are kept for this session only")
                try:  # a read-only file or a full disk: earlier answers can still be shown
                    self.store = AnswerStore(readonly=True)
                except ValueError:
                    self.store = None
        self.attempts: list[Attempt] = []
        self.first_try: dict[int, bool] = {}  # check index -> whether its first answer was right
        self.shown_params: dict[int, dict[str, float]] = {}  # numeric check -> params its question shows
        self.questions: list[widgets.HTML] = []
        self.inputs: list[widgets.Widget] = []
        self.feedback: list[widgets.HTML] = []
        self.score_html = widgets.HTML()
        self.score_html.add_class(LIVE)
        boxes = []
        for i, check in enumerate(entry.checks):
            self.questions.append(widgets.HTML())
            self.questions[-1].add_class(QUESTION)  # names the choices or the answer box below it
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
            self.feedback[-1].add_class(LIVE)  # "Correct." / "Not quite." is read out when it appears
            boxes.append(widgets.VBox([self.questions[i], widgets.HBox([field, button]), self.feedback[i]],
                                      layout=widgets.Layout(border_bottom="1px solid #eee", padding="4px 0")))
        extra = []
        if self.lab_checks:
            use_lab = widgets.Button(description="numbers from my lab settings", icon="refresh",
                                     layout=widgets.Layout(width="260px"))
            use_lab.on_click(lambda _: self.use_params(self.params_source()))
            extra.append(use_lab)
        self.export_button = widgets.Button(description="show my answers", icon="table",
                                            layout=widgets.Layout(width="200px"))
        self.export_area = widgets.HTML(layout=widgets.Layout(display="none"))  # a table of the attempts
        self.export_button.on_click(lambda _: self._show_export())
        self.reset_button = widgets.Button(description="reset my answers", icon="undo",
                                           layout=widgets.Layout(width="180px"))
        self.reset_button.on_click(lambda _: self.reset())
        self.use_params(None)
        self._resume()
        super().__init__([*boxes, self.score_html, widgets.HBox([*extra, self.export_button, self.reset_button]),
                          self.export_area, self.status, widgets.HTML(WRAP_OPTIONS_CSS), Aria()])
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
                value = content.check_answer(self.entry, i, own or None)
                grading = (f"<div style='color:#555;font-size:90%'>Graded: "
                           f"{esc(accepted_text(value, check.tolerance, check.unit))}.</div>")
            else:
                text, grading = check.question, ""
            self.questions[i].value = f"<b>Q{i + 1}.</b> {esc(text)}{grading}"
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
        if check.kind == "choice":
            if isinstance(response, bool) or not isinstance(response, int) or \
                    not 0 <= response < len(check.options):
                raise ValueError(f"answer: expected an option index 0 to {len(check.options) - 1}, got {response!r}")
            correct = content.is_correct(self.entry, index, response)
            question, params = check.question, {}
            given, expected = check.options[response], check.options[check.answer]
        else:
            typed = response if isinstance(response, str) else None
            if typed is not None:
                try:
                    response = parse_number(typed, check.unit)
                except ValueError as err:
                    if "," not in typed:
                        raise
                    raise ValueError(f"{err}: a comma only groups thousands (4,096); write a decimal with a "
                                     f"point (2.91)") from None
            if isinstance(response, bool) or not isinstance(response, int | float):
                raise ValueError(f"answer: expected a number in {check.unit}, got {response!r}")
            shown = self.shown_params.get(index) or None
            value = content.check_answer(self.entry, index, shown)
            correct = content.is_correct(self.entry, index, response, shown)
            question, params = content.render_question(self.entry, index, shown), dict(shown or check.params)
            given, expected = (typed.strip() if typed is not None else repr(response)), repr(value)
        attempt = Attempt(key=new_key(), learner=self.learner, entry_id=self.entry.id, check_index=index,
                          question=question, params=params, response=given, expected=expected,
                          correct=bool(correct), attempt=self._next_attempt(index), time=time.time(),
                          content_version=self.content_version)
        self._record(attempt)
        self._show_feedback(attempt)
        self._show_score()
        return bool(correct)

    def _next_attempt(self, index: int) -> int:
        return sum(a.check_index == index for a in self.attempts) + 1

    def _record(self, attempt: Attempt) -> None:
        """Keep the attempt on screen and in the store; in a class, hand it to the background sender."""
        self.attempts.append(attempt)
        self.first_try.setdefault(attempt.check_index, attempt.correct)
        in_class = _classroom_configured()
        saved = False
        if self.store is not None:
            try:
                self.store.add(attempt, outbox=in_class)
                saved = True
            except Exception as err:  # a full disk or a locked file must not lose the learner's feedback
                self._unsaved = f"answer store {self.store.path}: could not save this answer ({err})"
        if saved:
            self._unsaved = None  # an earlier failure is over: its line must not stay
        if not in_class:
            self._show_status(None)
            return
        sender = self._sender()
        if saved:
            sender.kick()
        else:  # in no store: post it straight to the service, from memory
            sender.send_direct(attempt)
        self._show_status(None)

    def _sender(self):
        from classroom.client import background_delivery

        sender = background_delivery(self.store)
        if self._on_delivery not in sender.listeners:
            sender.listeners.append(self._on_delivery)
        return sender

    def _on_delivery(self, result) -> None:
        self._show_status(result)

    def _show_status(self, result) -> None:
        """One line per problem: an answer not saved here, answers waiting for the service, refused ones."""
        lines = []
        if self._unsaved:
            lines.append(self._unsaved + ("; sent straight to the classroom service instead" if
                                          _classroom_configured() else "; it is kept for this session only"))
        if result is not None and result.pending and result.error:
            lines.append(f"{result.pending} answer(s) not yet sent to the classroom service ({result.error}); "
                         f"retrying in the background")
        try:
            refused = self.store.refused() if self.store is not None and _classroom_configured() else []
        except Exception:  # noqa: BLE001 - an unreadable store is reported where it is read
            refused = []
        if refused:
            lines.append(f"{len(refused)} answer(s) refused by the classroom service ({refused[-1][1]}): they stay "
                         f"on this server (dantinox answers export shows them) and are not sent again; "
                         f"tell your instructor")
        elif result is not None and result.refused:
            lines.append(f"{result.refused} answer(s) refused by the classroom service ({result.refusal}); "
                         f"tell your instructor")
        self.status.value = "".join(error_box(line) for line in lines)

    def _show_feedback(self, attempt: Attempt, earlier: bool = False) -> None:
        check = self.entry.checks[attempt.check_index]
        if check.kind == "choice":
            verdict = "Correct." if attempt.correct else "Not quite."
            chosen = check.options.index(attempt.response) if attempt.response in check.options else None
            note = check.feedback[chosen] if check.feedback and chosen is not None else ""
            if note.startswith(verdict):  # content often opens the right option's note with "Correct."
                note = note[len(verdict):].strip()
            lines = [verdict, note] if note else [verdict]
        else:
            value = float(attempt.expected)
            expected, accepted = number_text(value), accepted_text(value, check.tolerance, check.unit)
            given = attempt.response
            try:
                given = number_text(parse_number(given, check.unit))
            except ValueError:
                pass
            lines = [f"Correct: {expected} {check.unit}; {accepted}." if attempt.correct else
                     f"Not quite: the formula gives {expected} {check.unit}; you answered {given}; {accepted}."]
        if earlier:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(attempt.time))
            lines.insert(0, f"Your earlier answer ({when}, attempt {attempt.attempt}): {attempt.response}")
        colour = RIGHT if attempt.correct else WRONG
        self.feedback[attempt.check_index].value = (
            f"<div style='color:{colour}'>{'<br>'.join(esc(x) for x in lines)}</div>"
            f"<div style='color:#444'><i>Why:</i> {esc(check.explanation)}</div>")

    def _submit(self, index: int) -> None:
        field = self.inputs[index]
        try:
            if field.value is None or str(field.value).strip() == "":
                check = self.entry.checks[index]
                raise ValueError("answer: choose an option first" if check.kind == "choice" else
                                 f"answer: type a number in {check.unit} first")
            self.answer(index, field.value)
        except ValueError as err:
            self.feedback[index].value = error_box(str(err))

    # Resume and reset ------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Show this learner's earlier attempts at the entry (since their last reset) and their score."""
        if self.store is None:
            return
        try:
            earlier = self.store.attempts(self.learner, self.entry.id)
            in_class = _classroom_configured() and bool(self.store.pending() or self.store.refused())
        except Exception as err:  # a damaged file: the quiz still works, and says why nothing came back
            self.status.value = error_box(f"answer store {self.store.path}: could not read earlier answers ({err})")
            return
        for attempt in earlier:
            if attempt.check_index < len(self.entry.checks):
                self.attempts.append(attempt)
                self.first_try.setdefault(attempt.check_index, attempt.correct)
        last = {a.check_index: a for a in self.attempts}
        for attempt in last.values():
            self._show_feedback(attempt, earlier=True)
        self._show_score()
        if in_class:
            self._show_status(self._sender().last)
            self._sender().kick()

    def _stored_arrived(self) -> None:
        """The browser store has read the page's storage: show the earlier answers it holds."""
        self.attempts.clear()
        self.first_try.clear()
        self._resume()

    def _storage_error(self, change: dict) -> None:
        self.status.value = error_box(f"{self.store.path}: could not save an answer ({change['new']}); "
                                      f"it is kept for this session only") if change["new"] else ""

    def reset(self) -> int:
        """Start this entry over: earlier attempts leave the screen and the score (the store keeps them)."""
        hidden = self.store.reset(self.learner, self.entry.id) if self.store is not None else len(self.attempts)
        self.attempts.clear()
        self.first_try.clear()
        for i, check in enumerate(self.entry.checks):
            self.feedback[i].value = ""
            self.inputs[i].value = None if check.kind == "choice" else ""
        self._show_score()
        return hidden

    # Score and export ------------------------------------------------------------------------------
    @property
    def score(self) -> int:
        """Checks answered right on the first attempt."""
        return sum(self.first_try.values())

    @property
    def records(self) -> list[dict[str, Any]]:
        """The attempts on screen as JSON dicts (the fields of `classroom.store.Attempt`)."""
        return [a.to_json() for a in self.attempts]

    def _show_score(self) -> None:
        n = len(self.entry.checks)
        self.score_html.value = (f"<b>Score: {self.score} / {n}</b> (first attempts; {len(self.first_try)} of {n} "
                                 f"answered)")

    def to_json(self) -> str:
        """Every attempt on screen, as JSON: what `summarise` and `dantinox answers export` read."""
        return json.dumps(self.records, indent=1)

    def answers_html(self) -> str:
        """The attempts on screen as a table a learner reads (the JSON is `to_json`, or `dantinox answers
        export`)."""
        return answers_table(self.entry, self.attempts, getattr(self.store, "export_hint", DESKTOP_EXPORT_HINT))

    def _show_export(self) -> None:
        self.export_area.value = self.answers_html()
        self.export_area.layout.display = None


def _classroom_configured() -> bool:
    """Inside a hub user's server (which holds a hub token) whose hub runs the classroom service."""
    return bool(os.environ.get("JUPYTERHUB_API_TOKEN") and os.environ.get("DANTINOX_CLASSROOM_URL"))


def _content_version(entry: Any) -> str:
    try:
        return content.content_version(entry.id)
    except content.ContentError:  # an entry from another directory or built in memory: hash what was loaded
        return hashlib.sha256(entry.model_dump_json().encode()).hexdigest()


def summarise(records: list[Any]) -> list[dict[str, Any]]:
    """Per check, over any number of learners' attempts (Attempt objects or their JSON): learners, attempts,
    first-try right and rate. The classroom dashboard computes the same rows (`classroom.summary`)."""
    keys = ("entry", "check", "learners", "attempts", "first_try_right", "first_try_rate")
    return [{k: row[k] for k in keys} for row in question_rows(records)]
