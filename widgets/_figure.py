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
      subscribing = [];
      let cleanup, mine;
      try { cleanup = inner.render(context); } finally { mine = subscribing; subscribing = null; }
      return () => {
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
    and the modebar standing upright at the right (lying flat, it covers the title)."""

    _esm = _bundle()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for axis in ("xaxis", "yaxis"):  # the template's axis applies to every axis of the figure
            self.layout.template.layout[axis].exponentformat = "power"
        if self.layout.modebar.orientation is None:
            self.layout.modebar.orientation = "v"
