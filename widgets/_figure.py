"""plotly's FigureWidget, with its views' model listeners removed when a view goes away.

    fig = FigureWidget(layout=dict(height=300))   # use it wherever go.FigureWidget would be used

plotly's front-end (its anywidget bundle) subscribes each view to the model's update messages through the
model it got at `initialize`, and its view clean-up (`Plotly.purge`) never unsubscribes. A view is removed
whenever its widget leaves the page: a Tab's children replaced (the concept map switching entry), a cell
re-run. From then on every update first reaches the dead view, whose `Plotly.update` on a purged element
throws (`Error setting state: Cannot read properties of undefined (reading 'length')` in the console) and
stops the listeners after it, so the live view's plot freezes. The wrapper below records the listeners each
view adds while it renders and removes them with the view; the bundle itself is plotly's, unchanged.
"""

from __future__ import annotations

import re

import plotly
import plotly.graph_objects as go
import traitlets

from widgets import plot_text

_EXPORT = re.compile(r"export\s*\{([^{}]*\bas\s+FigureView\b[^{}]*)\}")
_WRAPPER = """
const plotlyFigureWidget = %s;
export default () => {
  const inner = plotlyFigureWidget();
  let initModel = null;    // the model plotly's views subscribe through (anywidget's initialize context)
  let subscribing = null;  // listeners added while one view renders
  return {
    initialize(context) {
      initModel = context.model;
      const tracked = Object.assign({}, initModel, {
        on(name, callback) {
          initModel.on(name, callback);
          if (subscribing) subscribing.push([name, callback]);
        },
      });
      return inner.initialize({ ...context, model: tracked });
    },
    render(context) {
      // the plot in its own div; below it, what it shows in words (widgets/plot_text.py)
      const { model, el } = context;
      const plot = document.createElement("div"), words = document.createElement("div");
      const sentence = document.createElement("p"), data = document.createElement("details");
      const toggle = document.createElement("summary"), tables = document.createElement("div");
      sentence.id = `plot-text-${Math.random().toString(36).slice(2)}`;
      sentence.className = "dantinox-plot-summary";
      toggle.textContent = "show data";
      tables.className = "dantinox-plot-data";
      data.append(toggle, tables);
      words.append(sentence, data);
      el.append(plot, words);
      el.setAttribute("role", "figure");
      el.setAttribute("aria-describedby", sentence.id);
      const show = () => {
        sentence.textContent = model.get("text_summary");
        el.setAttribute("aria-label", model.get("text_summary").split(". ")[0]);
        if (data.open) tables.innerHTML = model.get("text_tables");  // built by the kernel from escaped text
      };
      show();
      data.addEventListener("toggle", show);
      model.on("change:text_summary", show);
      model.on("change:text_tables", show);
      subscribing = [];
      let cleanup, mine;
      try { cleanup = inner.render({ ...context, el: plot }); } finally { mine = subscribing; subscribing = null; }
      return () => {
        model.off("change:text_summary", show);
        model.off("change:text_tables", show);
        for (const [name, callback] of mine) initModel.off(name, callback);
        if (typeof cleanup === "function") cleanup();
      };
    },
  };
};
"""


def _bundle() -> str:
    """plotly's widget bundle with its default export renamed, and the wrapper as the default export."""
    text = str(go.FigureWidget._esm)  # anywidget's FileContents of plotly/package_data/widgetbundle.js
    found = list(_EXPORT.finditer(text))
    default = [m for m in found if re.search(r"\bas\s+default\b", m.group(1))]
    if len(default) != 1:
        raise RuntimeError(f"plotly widget bundle: expected one export of FigureView and default, found "
                           f"{len(default)}; plotly {plotly.__version__} is not supported by widgets._figure")
    match = default[0]
    clause = match.group(1)
    local = re.search(r"([A-Za-z_$][\w$]*)\s+as\s+default\b", clause).group(1)
    renamed = re.sub(r"\s*,?\s*[A-Za-z_$][\w$]*\s+as\s+default\b", "", clause).strip(" ,")
    return text[:match.start()] + f"export{{{renamed}}}" + text[match.end():] + _WRAPPER % local


class FigureWidget(go.FigureWidget):
    """go.FigureWidget whose removed views stop listening (see the module docstring), with two defaults:
    large tick numbers as powers of ten (plotly's SI suffixes put "2B", billions, beside a unit [B], bytes)
    and the modebar standing upright at the right (lying flat, it covers the title). Under the plot, what it
    shows in words: `text_summary` and `text_tables` (widgets.plot_text), kept current with every change the
    kernel sends, so a screen reader reads the plot and nothing needs the mouse or the modebar."""

    _esm = _bundle()
    text_summary = traitlets.Unicode("").tag(sync=True)  # one sentence: what the plot shows
    text_tables = traitlets.Unicode("").tag(sync=True)  # its data, one HTML table per series

    def __init__(self, *args, **kwargs):
        self._described = False  # plotly sends messages while it builds the figure: describe once it is built
        super().__init__(*args, **kwargs)
        for axis in ("xaxis", "yaxis"):  # the template's axis applies to every axis of the figure
            self.layout.template.layout[axis].exponentformat = "power"
        if self.layout.modebar.orientation is None:
            self.layout.modebar.orientation = "v"
        self._described = True
        self._describe()

    def _describe(self) -> None:
        if self._described:
            self.text_summary, self.text_tables = plot_text.describe(self)

    # every change the kernel makes to the figure reaches the page through one of these
    def _send_relayout_msg(self, *args, **kwargs):
        super()._send_relayout_msg(*args, **kwargs)
        self._describe()

    def _send_restyle_msg(self, *args, **kwargs):
        super()._send_restyle_msg(*args, **kwargs)
        self._describe()

    def _send_update_msg(self, *args, **kwargs):
        super()._send_update_msg(*args, **kwargs)
        self._describe()

    def _send_addTraces_msg(self, *args, **kwargs):
        super()._send_addTraces_msg(*args, **kwargs)
        self._describe()

    def _send_deleteTraces_msg(self, *args, **kwargs):
        super()._send_deleteTraces_msg(*args, **kwargs)
        self._describe()

    def _send_moveTraces_msg(self, *args, **kwargs):
        super()._send_moveTraces_msg(*args, **kwargs)
        self._describe()
