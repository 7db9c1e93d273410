"""plotly's FigureWidget, loaded once a page, with its views' model listeners removed when a view goes away.

    fig = FigureWidget(layout=dict(height=300))   # use it wherever go.FigureWidget would be used

Loaded once a page. plotly's front-end is one 5 MB module (plotly.js with its widget) that anywidget imports
afresh for every figure, from the figure's own `_esm`: about 1 s of the page's only thread each, measured in a
headless Chromium here, and anywidget gives every model 2 s from its creation to start ("[anywidget] Failed to
initialize model."). A lab with six plots blocked the page for 6 s and the models that started in those
seconds (plots and the Aria of widgets._a11y alike) failed under load. Here `_esm` is a small wrapper and the
bundle travels as a trait: the first figure of a page imports it once the page is idle (the widgets that
arrived with it have started by then), the others reuse that import, and none waits for it inside anywidget's
2 s: `initialize` returns at once and keeps plotly's messages that arrive before the bundle has loaded, to hand
them to plotly's model in order once it exists (a new snapshot of the figure, sent when it is displayed, makes
the earlier ones moot).

Listeners of removed views. plotly's views subscribe to the model's update messages through the model it got
at `initialize`, and its view clean-up (`Plotly.purge`) never unsubscribes. A view is removed whenever its
widget leaves the page: a Tab's children replaced (the concept map switching entry), a cell re-run. From then
on every update first reaches the dead view, whose `Plotly.update` on a purged element throws (`Error setting
state: Cannot read properties of undefined (reading 'length')` in the console) and stops the listeners after
it, so the live view's plot freezes. The wrapper records the listeners each view adds while it renders and
removes them with the view; the bundle itself is plotly's, unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re

import plotly
import plotly.graph_objects as go
import traitlets

from widgets import plot_text

_WRAPPER = """
const BUNDLE = %(key)s;    // plotly's bundle, by the hash of its text: one import a page, shared by its figures
const MESSAGES = %(messages)s;  // plotly's kernel-to-page messages: each set, then at once set to null
const SNAPSHOTS = ["change:_widget_data", "change:_widget_layout"];  // the whole figure, sent when displayed

function plotlyBundle(model) {
  const loaded = (globalThis.__dantinoxPlotly ??= new Map());
  if (!loaded.has(BUNDLE)) {
    // imported once the page has nothing queued: the models that arrived with this one have started by then, and
    // the bundle's 1-3 s of evaluation cannot eat into their 2 s (models that come during it start after it); on a
    // page never idle, after 2 s, when every model that came before has had its 2 s
    const idle = globalThis.requestIdleCallback ? (resolve) => requestIdleCallback(resolve, { timeout: 2000 })
                                                : (resolve) => setTimeout(resolve, 200);
    const url = URL.createObjectURL(new Blob([model.get("_plotly_bundle")], { type: "text/javascript" }));
    loaded.set(BUNDLE, new Promise((resolve) => idle(resolve)).then(() => import(url))
      .finally(() => URL.revokeObjectURL(url)));
  }
  return loaded.get(BUNDLE);
}

export default () => {
  let inner = null;        // plotly's widget, once its bundle has loaded
  let ready = null;        // settles when plotly's model listens
  let initModel = null;    // the model plotly's views subscribe through (anywidget's initialize context)
  let subscribing = null;  // listeners added while one view renders
  return {
    initialize(context) {
      initModel = context.model;
      const early = [];      // [name, value] of the messages that came before plotly's model, in order
      let replaying = null;  // the message being handed over: plotly's handlers read it with get()
      const keepers = MESSAGES.map((name) => [`change:${name}`, () => {
        const value = initModel.get(name);
        if (value !== null) early.push([name, value]);
      }]);
      const moot = () => { early.length = 0; };
      for (const [event, keep] of keepers) initModel.on(event, keep);
      for (const event of SNAPSHOTS) initModel.on(event, moot);
      const handlers = [];  // what plotly's model listens to, to hand it the early messages
      const tracked = Object.assign({}, initModel, {
        get(name) { return replaying && replaying[0] === name ? replaying[1] : initModel.get(name); },
        on(name, callback) {
          initModel.on(name, callback);
          if (subscribing) subscribing.push([name, callback]);
          else handlers.push([name, callback]);
        },
      });
      ready = plotlyBundle(initModel).then((bundle) => {
        for (const [event, keep] of keepers) initModel.off(event, keep);
        for (const event of SNAPSHOTS) initModel.off(event, moot);
        inner = bundle.default();
        inner.initialize({ ...context, model: tracked });
        for (replaying of early) {
          for (const [name, callback] of handlers) {
            if (name === `change:${replaying[0]}`) callback(tracked, replaying[1], {});
          }
        }
        replaying = null;
      });
    },
    async render(context) {
      // the plot in its own div; below it, what it shows in words (widgets/plot_text.py), there at once
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
      await ready;  // plotly's bundle (the page's first figure imports it)
      // one plot drawn a task: the figures of a cell become ready at once, and drawn in one go they would hold the
      // page for seconds, past the 2 s in which other widgets' models of the cell must start
      await new Promise((resolve) => setTimeout(resolve));
      subscribing = [];
      let cleanup, mine;
      try { cleanup = inner.render({ ...context, el: plot }); } finally { mine = subscribing; subscribing = null; }
      el.dataset.dantinoxStarted = "";  // started and drawn (what a test waits for before it holds the page)
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
    """plotly's widget bundle as plotly ships it, once checked that its default export is the widget."""
    text = str(go.FigureWidget._esm)  # anywidget's FileContents of plotly/package_data/widgetbundle.js
    clauses = [c for c in re.findall(r"export\s*\{([^{}]*)\}", text) if re.search(r"\bas\s+FigureView\b", c)]
    if len([c for c in clauses if re.search(r"\bas\s+default\b", c)]) != 1:
        raise RuntimeError(f"plotly widget bundle: expected one export of FigureView and default; plotly "
                           f"{plotly.__version__} is not supported by widgets._figure")
    return text


_BUNDLE = _bundle()
_MESSAGES = sorted(n for n in go.FigureWidget.class_trait_names(sync=True) if n.startswith("_py2js_"))


class FigureWidget(go.FigureWidget):
    """go.FigureWidget whose removed views stop listening (see the module docstring), with two defaults:
    large tick numbers as powers of ten (plotly's SI suffixes put "2B", billions, beside a unit [B], bytes)
    and the modebar standing upright at the right (lying flat, it covers the title). Under the plot, what it
    shows in words: `text_summary` and `text_tables` (widgets.plot_text), kept current with every change the
    kernel sends, so a screen reader reads the plot and nothing needs the mouse or the modebar."""

    _esm = _WRAPPER % {"key": json.dumps(hashlib.sha256(_BUNDLE.encode()).hexdigest()[:16]),
                       "messages": json.dumps(_MESSAGES)}
    _plotly_bundle = traitlets.Unicode(_BUNDLE).tag(sync=True)  # imported by the page's first figure
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
        self.add_class("dantinox-plot")

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
