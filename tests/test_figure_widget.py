"""widgets._figure.FigureWidget: plotly's widget with view listeners removed with their view.

The behaviour itself is checked in a real browser: a plot that keeps following after its view was replaced in
tests/browser, the concepts lab's explorer_after_switching_entry scenario; one import of plotly's bundle a page
and no message lost while it loads in tests/browser/test_figure_loading.py. Here: the bundle is plotly's,
unchanged, beside a small wrapper, and no widget builds a plain go.FigureWidget (which would bring the frozen plot
back).
"""

import json
import re
from pathlib import Path

import plotly.graph_objects as go

from widgets._figure import FigureWidget

WIDGETS = Path(__file__).resolve().parents[1] / "widgets"


def test_the_bundle_travels_unchanged_beside_a_small_wrapper():
    ours = FigureWidget()
    assert ours._plotly_bundle == str(go.FigureWidget._esm)  # plotly's, byte for byte
    assert len(FigureWidget._esm) < 10_000  # the wrapper only: plotly.js is 5 MB
    assert len(re.findall(r"^export default ", FigureWidget._esm, re.M)) == 1
    assert "initModel.off(name, callback)" in FigureWidget._esm
    # every message plotly's kernel side sends is one the wrapper keeps until the bundle has loaded
    sent = sorted(n for n in go.FigureWidget.class_trait_names(sync=True) if n.startswith("_py2js_"))
    assert sent and f"const MESSAGES = {json.dumps(sent)};" in FigureWidget._esm


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
