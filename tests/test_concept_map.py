"""The concept map, headless: every entry on it, arrows from prerequisites, a valid learning path, selection
by click or by id, lab links from `lab_id`, and a new author's entry appearing with no code change."""

from __future__ import annotations

import html
import shutil
from pathlib import Path

import pytest
from plotly.callbacks import Points

import content
from widgets import ConceptMap, FormulaExplorer, Quiz, learning_path
from widgets._html import esc
from widgets.card import ConceptCard
from widgets.concept_map import LABS_DIR, depths, lab_notebook

ENTRIES = content.load_all()
BASE = Path(__file__).parent / "content_fixtures" / "base" / "fixture-base.yaml"


@pytest.fixture(scope="module")
def concept_map() -> ConceptMap:
    return ConceptMap(ENTRIES)


def _arrows(cmap: ConceptMap) -> set[tuple[str, str]]:
    by_pos = {pos: i for i, pos in cmap.positions.items()}
    return {(by_pos[(a.ax, a.ay)], by_pos[(a.x, a.y)]) for a in cmap.figure.layout.annotations if a.showarrow}


def test_every_entry_is_a_node_and_every_prerequisite_an_arrow(concept_map):
    nodes = concept_map.figure.data[-1]
    assert sorted(nodes.customdata) == sorted(ENTRIES)
    assert _arrows(concept_map) == {(p, i) for i, e in ENTRIES.items() for p in e.prerequisites}
    depth = depths(ENTRIES)
    assert all(depth[p] < depth[i] for p, i in _arrows(concept_map))


def test_learning_path_puts_prerequisites_first():
    path = learning_path(ENTRIES)
    assert sorted(path) == sorted(ENTRIES) and path == learning_path(list(ENTRIES.values())[::-1])
    for i, entry_id in enumerate(path):
        assert set(ENTRIES[entry_id].prerequisites) <= set(path[:i])
    assert path[0] == "attention"  # the foundation with no prerequisites that sorts first


def test_learning_path_refuses_a_cycle():
    a = ENTRIES["kv-cache"]
    b = ENTRIES["attention"].model_copy(update={"prerequisites": ["kv-cache"]})
    with pytest.raises(ValueError, match=r"^prerequisites: expected no cycle, got one among attention, kv-cache$"):
        learning_path([a, b])


@pytest.mark.parametrize("entry_id", sorted(ENTRIES))
def test_selecting_any_entry_shows_its_card_explorer_and_quiz(concept_map, entry_id):
    entry = ENTRIES[entry_id]
    concept_map.select(entry_id)
    assert concept_map.selected == entry_id and concept_map.picker.value == entry_id
    assert isinstance(concept_map.card, ConceptCard) and concept_map.card.entry is entry
    assert isinstance(concept_map.explorer, FormulaExplorer) and concept_map.explorer.entry is entry
    assert isinstance(concept_map.quiz, Quiz) and concept_map.quiz.entry is entry
    assert list(concept_map.tabs.children) == [concept_map.explorer, concept_map.quiz, concept_map.card]
    assert html.escape(entry.learning_objective) in concept_map.header_html.value
    title = entry.science[0].title
    assert concept_map.explorer.reading.result == content.evaluate(entry, title, **concept_map.explorer.values)
    widths = dict(zip(concept_map.figure.data[-1].customdata, concept_map.figure.data[-1].marker.line.width,
                      strict=True))
    assert widths[entry_id] == 3 and sum(w == 3 for w in widths.values()) == 1


def test_quiz_of_the_selected_entry_grades(concept_map):
    concept_map.select("serving")
    quiz = concept_map.quiz
    index = next(i for i, c in enumerate(quiz.entry.checks) if c.kind == "numeric")
    assert quiz.answer(index, content.check_answer(quiz.entry, index))
    concept_map.select("attention")
    concept_map.select("serving")
    assert concept_map.quiz is quiz and quiz.score == 1  # pages are kept, with the learner's answers


def test_clicking_a_node_selects_it(concept_map):
    nodes = concept_map.figure.data[-1]
    k = list(nodes.customdata).index("paged-attention")
    nodes._dispatch_on_click(Points(point_inds=[k], xs=[nodes.x[k]], ys=[nodes.y[k]], trace_name="entries",
                                    trace_index=1), None)
    assert concept_map.selected == "paged-attention"
    concept_map.picker.value = "hbm-stack"  # the dropdown is the same selection
    assert concept_map.selected == "hbm-stack" and concept_map.explorer.entry.id == "hbm-stack"


def test_unknown_entry_is_refused_in_one_line(concept_map):
    with pytest.raises(ValueError, match=r"^entry_id: expected one of the entries on the map \(attention, .*\), "
                                         r"got 'kv-cach'$"):
        concept_map.select("kv-cach")


def test_lab_links_come_from_lab_id(concept_map, tmp_path):
    with_labs = {i: e.lab_id for i, e in ENTRIES.items() if e.lab_id}
    assert {"kv-cache", "multi-head-latent-attention", "diffusion-dual-cache"} <= set(with_labs)
    for entry_id, lab_id in with_labs.items():
        assert lab_notebook(ENTRIES[entry_id]) == f"{lab_id}.ipynb" and (LABS_DIR / f"{lab_id}.ipynb").is_file()
        concept_map.select(entry_id)
        assert f"href='{lab_id}.ipynb'" in concept_map.header_html.value
        assert f"href='{lab_id}.ipynb'" in concept_map.path_html.value
    concept_map.select("hbm-stack")
    assert "No dedicated lab yet" in concept_map.header_html.value
    assert lab_notebook(ENTRIES["kv-cache"], tmp_path) is None  # no notebook there: no link


def test_a_new_entry_appears_with_no_code_change(tmp_path):
    root = tmp_path / "entries"
    shutil.copytree(content.CONTENT_DIR, root)
    name = "<b>Fresh</b> concept"
    text = BASE.read_text().replace("id: fixture-base", "id: fresh-concept", 1)
    text = text.replace("name: Fixture entry", f"name: '{name}'", 1).replace("lab_id: null", "lab_id: fresh-concept")
    (root / "fresh-concept.yaml").write_text(text)
    labs = tmp_path / "labs"
    labs.mkdir()
    (labs / "fresh-concept.ipynb").write_text("{}")
    entries = content.load_all(root)
    cmap = ConceptMap(entries, labs_dir=labs)
    assert "fresh-concept" in cmap.figure.data[-1].customdata
    path = cmap.path
    assert path.index("kv-cache") < path.index("fresh-concept")
    assert ("kv-cache", "fresh-concept") in _arrows(cmap)
    cmap.select("fresh-concept")
    entry = entries["fresh-concept"]
    assert html.escape(name) in cmap.header_html.value and name not in cmap.header_html.value
    assert "href='fresh-concept.ipynb'" in cmap.header_html.value
    item = entry.science[0]
    for var_name, var in item.variables.items():
        cmap.explorer.set(**{var_name: var.max})
    assert cmap.explorer.reading.result == content.evaluate(entry, item.title, **{n: v.max for n, v in
                                                                                 item.variables.items()})
    index = next(i for i, c in enumerate(entry.checks) if c.kind == "numeric")
    assert cmap.quiz.answer(index, content.check_answer(entry, index))


def test_map_text_is_escaped(concept_map):
    assert all("<" not in t or "&lt;" in t for t in concept_map.figure.data[-1].text)
    assert "<script" not in concept_map.path_html.value


def test_in_the_browser_a_dedicated_lab_is_said_to_need_the_full_install(monkeypatch, tmp_path):
    """The course site carries no model labs: the header says what opens them instead of 'not in this checkout'."""
    import sys

    from widgets.concept_map import entry_summary_html

    monkeypatch.setattr(sys, "platform", "emscripten")
    text = entry_summary_html(ENTRIES["kv-cache"], labs_dir=tmp_path)
    assert "labs/kv-cache.ipynb" in text and "full install" in text and "python3 dev.py lab" in text


def test_node_names_are_drawn_over_the_arrows_on_a_white_box(concept_map):
    """As scatter text the names sat under the arrows that cross them."""
    notes = concept_map.figure.layout.annotations
    labels = [a for a in notes if not a.showarrow]
    assert sorted(a.text for a in labels) == sorted(esc(e.short_name) for e in ENTRIES.values())
    assert all(a.bgcolor and a.bgcolor.startswith("rgba(255,255,255") for a in labels)
    first_label = next(k for k, a in enumerate(notes) if not a.showarrow)
    assert all(not a.showarrow for a in notes[first_label:])  # drawn after (over) every arrow
    assert "text" not in concept_map.figure.data[-1].mode
