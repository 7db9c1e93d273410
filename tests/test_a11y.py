"""What a screen reader gets from the widgets, checked headless (axe-core checks the page: tests/browser/axe.py).

Every NumberInput names its slider and box with its quantity, unit and value; every lab and quiz holds an Aria
(which names plain sliders and marks live regions); quiz feedback and lab status lines are live regions. (Plots
in words: test_plot_text.py.)
"""

import ast
from pathlib import Path

import pytest

import content
from widgets import CacheLab, Quiz
from widgets._a11y import LIVE, QUESTION, Aria
from widgets.number_input import NumberInput

WIDGETS = Path(__file__).resolve().parents[1] / "widgets"


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


def test_a_number_input_names_its_slider_and_box_with_its_unit_and_value():
    tokens = NumberInput(value=512, min=1, max=131_072, scale="log", description="tokens T", unit="tokens")
    # Aria (in the lab around it) gives the handle its slider's tooltip as its name; the box's is its title
    assert tokens.slider.tooltip == "tokens T, 512 tokens"
    assert tokens.box.tooltip == "tokens T in tokens, typed"
    tokens.type("100,000")
    assert tokens.slider.tooltip == "tokens T, 100,000 tokens"  # follows the value as the box shows it
    tokens.value = 7
    assert tokens.slider.tooltip == "tokens T, 7 tokens"
    assert LIVE in tokens.note._dom_classes  # "taken" / "refused" is read out


def test_every_number_input_of_the_cache_lab_speaks(entry):
    lab = CacheLab(entry, preset="test", tokens=32, attention="gqa", cache_dtype="bfloat16")
    parts = list(walk(lab))
    inputs = [w for w in parts if isinstance(w, NumberInput)]
    assert inputs, "the cache lab has no NumberInput"
    for control in inputs:
        assert control.unit and control.slider.tooltip == f"{control.name}, {control.box.value} {control.unit}"
    assert any(isinstance(w, Aria) for w in lab.children), "nothing in the lab gives its sliders their names"
    assert LIVE in lab.status_html._dom_classes


def test_quiz_feedback_is_a_live_region_and_questions_name_their_answers(entry):
    quiz = Quiz(entry)
    assert any(isinstance(w, Aria) for w in quiz.children)
    assert all(LIVE in f._dom_classes for f in quiz.feedback) and LIVE in quiz.score_html._dom_classes
    assert all(QUESTION in q._dom_classes for q in quiz.questions)


def test_every_number_input_in_the_widgets_says_its_unit():
    """A screen reader reads the handle as 'tokens T, 512 tokens': every NumberInput the widgets build has a unit."""
    missing = []
    for path in sorted(WIDGETS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NumberInput":
                if "unit" not in {k.arg for k in node.keywords}:
                    missing.append(f"{path.name}:{node.lineno}")
    assert not missing, f"NumberInput without a unit: {missing}"


def test_every_box_of_the_widgets_that_holds_a_slider_holds_an_aria():
    """A slider's handle is named by an Aria in its box (or a box around it): each widget module that builds an
    IntSlider or FloatSlider, or a NumberInput outside a Lab (which adds its own), places an Aria."""
    missing = []
    for path in sorted(WIDGETS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        sliders = any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) in ("IntSlider", "FloatSlider")
                      for n in ast.walk(tree))
        bases = {getattr(b, "id", getattr(b, "attr", "")) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                 for b in n.bases}
        if sliders and "Lab" not in bases and "Aria()" not in text:
            missing.append(path.name)
    assert not missing, f"sliders with no Aria to name them: {missing}"

