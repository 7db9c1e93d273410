"""widgets._figure.FigureWidget: plotly's widget with view listeners removed with their view.

The behaviour itself (a plot that keeps following after its view was replaced) is checked in a real browser:
tests/browser, the concepts lab's explorer_after_switching_entry scenario. Here: the bundle is plotly's with
one wrapper added, and no widget builds a plain go.FigureWidget (which would bring the frozen plot back).
"""

import re
from pathlib import Path

import plotly.graph_objects as go

from widgets._figure import FigureWidget

WIDGETS = Path(__file__).resolve().parents[1] / "widgets"


def test_bundle_is_plotlys_with_one_default_export_the_wrapper():
    ours, theirs = FigureWidget._esm, str(go.FigureWidget._esm)
    assert len(re.findall(r"^export default ", ours, re.M)) == 1
    assert "as default}" in theirs and len(ours) - len(theirs) < 3000
    assert re.search(r"export\{TD as FigureModel,MD as FigureView\}|export\{[^}]*as FigureView[^}]*\}", ours)
    assert "initModel.off(name, callback)" in ours


def test_figure_widget_holds_the_same_figure_as_plotlys():
    layout = dict(height=200, title=dict(text="t"))
    data = [go.Scatter(x=[1, 2], y=[3, 4])]
    ours, theirs = (f(data=data, layout=layout).to_dict() for f in (FigureWidget, go.FigureWidget))
    for figure in (ours, theirs):
        for trace in figure["data"]:
            trace.pop("uid")  # random per trace
    assert ours["data"] == theirs["data"]
    assert {k: ours["layout"][k] for k in layout} == {k: theirs["layout"][k] for k in layout}


def test_large_ticks_are_powers_of_ten_and_the_modebar_stands_clear_of_the_title():
    fig = FigureWidget(layout=dict(title=dict(text="t")))
    assert fig.layout.template.layout.xaxis.exponentformat == fig.layout.template.layout.yaxis.exponentformat \
        == "power"  # never plotly's 'B' for billions beside a byte axis
    assert fig.layout.modebar.orientation == "v"
    assert FigureWidget(layout=dict(modebar=dict(orientation="h"))).layout.modebar.orientation == "h"


def test_no_widget_builds_a_plain_plotly_figure_widget():
    offenders = [p.name for p in WIDGETS.glob("*.py")
                 if p.name != "_figure.py" and "go.FigureWidget(" in p.read_text(encoding="utf-8")]
    assert not offenders, f"use widgets._figure.FigureWidget (views that go away stop listening): {offenders}"
