"""widgets.plot_text and FigureWidget's words under the plot: a one-sentence summary and the data as tables,
current after every change the kernel makes (the page shows them: widgets/_figure.py's wrapper)."""

import plotly.graph_objects as go

import content
from widgets import CacheLab, CachePlot
from widgets._figure import FigureWidget
from widgets.plot_text import MAX_ROWS, describe


def test_a_plot_is_described_in_one_sentence_and_listed_as_tables():
    fig = FigureWidget(layout=dict(title=dict(text="bytes vs T<br><sup>derived</sup>"),
                                   xaxis=dict(title="tokens T"), yaxis=dict(title="bytes")))
    assert fig.text_summary == "Plot: bytes vs T — derived. No data yet."
    fig.add_trace(go.Scatter(x=[1, 2], y=[10, 20], name="MHA, derived"))
    fig.add_trace(go.Scatter(x=[1], y=[10], name="measured"))
    assert fig.text_summary == ("Plot: bytes vs T — derived. 2 series of bytes against tokens T: MHA, derived; "
                                "measured.")
    assert fig.text_tables.count("<table>") == 2 and "<th scope='col'>tokens T</th>" in fig.text_tables
    with fig.batch_update():
        fig.data[0].y = [30, 40]
    assert "<td>40</td>" in fig.text_tables


def test_long_series_heatmaps_and_markup_in_names():
    fig = go.Figure(go.Scatter(x=list(range(1000)), y=list(range(1000)), name="<b>a</b> & b"))
    fig.add_trace(go.Heatmap(z=[[1, 2], [3, 4]], x=["k", "v"], y=[0, 1]))
    sentence, tables = describe(fig)
    assert "a &amp; b" in tables and "<b>" not in tables  # names are text, escaped
    assert tables.split("</table>")[0].count("<tr>") <= MAX_ROWS + 1 and "every 5th of 1,000 points" in tables
    assert "<th scope='col'>k</th>" in tables and "<td>4</td>" in tables
    assert sentence.startswith("Plot: untitled plot. 2 series")


def test_the_cache_plot_lists_each_new_measured_dot():
    lab = CacheLab(content.load_entry("kv-cache"), preset="test", tokens=32, attention="gqa", cache_dtype="bfloat16")
    fig = CachePlot(lab).figure  # the lab's plot, beside it in the notebook
    assert fig.text_summary.startswith("Plot: KV cache vs tokens") and "<table>" in fig.text_tables

    def measured() -> str:
        return next(t for t in fig.text_tables.split("</table>") if "<caption>real arrays, measured" in t)

    assert "<td>64</td>" not in measured()
    lab.update(tokens=64)
    assert "<td>64</td>" in measured()  # the new measured dot is listed
