"""widgets._figure's front-end in a bare Chromium page, with a stand-in for anywidget's model: plotly's bundle is
imported once for two figures, `initialize` returns at once (anywidget gives a model 2 s to start, and the
bundle takes about 1 s of the page's thread alone), and plotly's messages sent before the bundle has loaded still
reach the plot, in order, except those a later snapshot of the figure already holds.

    .venv/bin/python -m pytest tests/browser/test_figure_loading.py -q -p no:cacheprovider
"""

from __future__ import annotations

from widgets._figure import _BUNDLE, FigureWidget

TWO_FIGURES = """async ([esm, bundle]) => {
  const blobs = [], create = URL.createObjectURL;
  URL.createObjectURL = (b) => { blobs.push(b.size); return create.call(URL, b); };
  const wrapper = (await import(URL.createObjectURL(new Blob([esm], {type: "text/javascript"})))).default;
  const model = (traces) => {  // what anywidget hands a widget: get, set, on, off; fire() plays the kernel
    const state = {_plotly_bundle: bundle, _widget_data: traces, _widget_layout: {}, _config: {},
                   text_summary: "Plot: two lines.", text_tables: ""};
    const listeners = [];
    return {state, get: (n) => state[n], set: (n, v) => { state[n] = v; }, save_changes() {}, send() {},
            on: (n, f) => { listeners.push([n, f]); },
            off: (n, f) => {
              const i = listeners.findIndex(([m, g]) => m === n && g === f);
              if (i >= 0) listeners.splice(i, 1);
            },
            fire(n, v) { state[n] = v; for (const [m, f] of [...listeners]) if (m === `change:${n}`) f(this, v, {}); }};
  };
  const trace = (name) => ({type: "scatter", x: [1, 2], y: [3, 4], name, uid: name});
  const message = (m, name, value) => { m.fire(name, value); m.fire(name, null); };  // as plotly's kernel side does
  const a = model([trace("a0")]), b = model([]);
  const [wa, wb] = [wrapper(), wrapper()];
  const returned = [wa.initialize({model: a}), wb.initialize({model: b})];
  message(a, "_py2js_addTraces", {trace_data: [trace("a1")]});
  message(b, "_py2js_addTraces", {trace_data: [trace("b0")]});
  b.fire("_widget_data", [trace("b0")]);  // b displayed: its snapshot holds the message before it
  message(b, "_py2js_addTraces", {trace_data: [trace("b1")]});
  const [ea, eb] = [document.createElement("div"), document.createElement("div")];
  document.body.append(ea, eb);
  await Promise.all([wa.render({model: a, el: ea}), wb.render({model: b, el: eb})]);
  message(a, "_py2js_addTraces", {trace_data: [trace("a2")]});  // after the bundle: plotly's own listeners
  const names = (el) => el.querySelector(".js-plotly-plot").data.map((t) => t.name);
  return {returned: returned.map(String), a: names(ea), b: names(eb), bundles: blobs.filter((n) => n > 1e6).length,
          summary: ea.querySelector(".dantinox-plot-summary").textContent};
}"""


def test_two_figures_share_one_import_and_miss_no_early_message(browser):
    context = browser.new_context()
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        found = page.evaluate(TWO_FIGURES, [FigureWidget._esm, _BUNDLE])
    finally:
        context.close()
    assert found["returned"] == ["undefined", "undefined"], "initialize waited for plotly's bundle"
    assert found["bundles"] == 1, f"plotly's bundle imported {found['bundles']} times for two figures"
    assert found["a"] == ["a0", "a1", "a2"], f"a message lost or out of order: {found['a']}"
    assert found["b"] == ["b0", "b1"], f"a message the snapshot held was applied again, or one lost: {found['b']}"
    assert found["summary"] == "Plot: two lines." and not errors, errors
