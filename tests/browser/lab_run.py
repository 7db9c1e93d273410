"""Every notebook in labs/, opened in JupyterLab in a real Chromium, run as a learner runs it (a lab whose spec says
`in_site` is run so in the course site instead: test_site.py, with the same slider, presses, quiz and scenarios).

The labs are cut in two shares, balanced by the time each takes (lab_specs.shares), and each share is one
test file (test_labs_share0.py, test_labs_share1.py): `dev.py test` keeps a file on one worker, so the two
shares run at once, each on its worker's own JupyterLab and Chromium.

For each lab: Run All from the menu, then no error output, no browser console error, every widget and
plot on screen, one slider that changes a readout the kernel writes, one button that does what it says,
and one quiz answer that gets feedback; then a keyboard-only walk of every control, and axe-core after Run
All and at the end (docs/accessibility.md). What to touch in each lab is data, in lab_specs.py.

    .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider
    .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider -k mla           # one lab
    DANTINOX_SCREENSHOTS=1 .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider   # rewrite docs/screenshots

A failing lab leaves a screenshot of the whole page (its path is printed); with DANTINOX_SCREENSHOTS=1 every
lab's is taken and replaces the committed one in docs/screenshots/ (1200 px wide, reduced to 256 colours).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

import axe
from lab_specs import Press, shares, spec_for
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "labs").glob("*.ipynb"))
SHARE = shares([p.stem for p in NOTEBOOKS])
SCREENSHOTS = ROOT / "docs" / "screenshots"
RUN_ALL_TIMEOUT_S = 420  # the diffusion lab trains its model in a cell
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'  # tracebacks render here
WIDGET_OUTPUT = ".jp-OutputArea-output:has(.jupyter-widgets)"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
KERNEL_TEXT = ".widget-html-content, .widget-htmlmath-content"  # HTML widgets: text only the kernel writes
ALL_RAN = """() => {
  const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim());
  // finished, or stopped at an error (JupyterLab then leaves the cells after it unrun)
  return prompts.some(t => /^\\[\\d+\\]:$/.test(t)) && !prompts.some(t => t.includes('*'));
}"""
STARTED = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
  .some(e => /^\\[(\\*|\\d+)\\]:$/.test(e.textContent.trim()))"""


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


KERNEL_READY = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const name = panel && panel.querySelector('.jp-KernelName');
  const status = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
  // before the session starts the indicator already reads "idle" beside "No Kernel": both must have moved on
  return !!(name && status && name.textContent.trim() !== 'No Kernel' && status.dataset.status === 'idle');
}"""


def _wait_for_kernel(page, timeout_s: float = 60.0) -> None:
    """Until the notebook's kernel is up and idle in the page. A fresh JupyterLab may first ask which kernel to
    start: take the one it proposes. (Measured here: the kernel is idle about 2 s after the first cell shows.)"""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(KERNEL_READY):
        dialog = page.locator(".jp-Dialog")
        if dialog.count():
            dialog.locator(".jp-mod-accept").first.click()
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s: the notebook's kernel never became idle")
        page.wait_for_timeout(100)


def run_all_cells(page, name: str) -> None:
    """Run All from the menu. Under load JupyterLab has been seen to drop the first request (a kernel shown idle,
    every prompt still "[ ]:" after 420 s, with four test workers on two cores): if no cell has started after
    60 s, no cell has run, so the learner's second click is safe and is made once."""
    _menu(page, "Run", "Run All Cells")
    try:
        page.wait_for_function(STARTED, timeout=60_000, polling=500)
    except PlaywrightTimeout:
        print(f"{name}: no cell started 60 s after Run All; running all cells again")
        _menu(page, "Run", "Run All Cells")
        page.wait_for_function(STARTED, timeout=60_000, polling=500)


def _kernel_text(cell) -> str:
    return "\n".join(cell.locator(KERNEL_TEXT).all_inner_texts())


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


def _button(scope, label: str):
    """An ipywidgets button by its text (an icon beside the text is allowed)."""
    return scope.locator("button.widget-button", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))


def _cell_with(page, element):
    """The notebook cell that holds `element` (a locator resolving to one element)."""
    index = element.evaluate("e => [...document.querySelectorAll('.jp-CodeCell')].indexOf(e.closest('.jp-CodeCell'))")
    return page.locator(".jp-CodeCell").nth(index)


def _save_screenshot(cell, stem: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.png"
    target, page = cell.locator(".jp-Cell-outputWrapper"), cell.page
    size, box = page.viewport_size, cell.locator(".jp-Cell-outputWrapper").bounding_box()
    # An output taller than the window would be photographed partly under JupyterLab's menu bar: a taller window
    # for the photograph, then the old size back.
    tall = box is not None and box["height"] + 150 > size["height"]
    if tall:
        page.set_viewport_size({"width": size["width"], "height": int(box["height"]) + 250})
        page.wait_for_timeout(500)  # JupyterLab lays the panel out again
    try:
        target.screenshot(path=path, animations="disabled")
    finally:
        if tall:
            page.set_viewport_size(size)
    try:
        from PIL import Image

        with Image.open(path) as image:  # 256 colours: a third of the bytes, no visible loss on flat UI colours
            image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    except ImportError:
        pass
    return path


def _slider_shown(slider) -> str:
    """A slider's value as shown: its readout, or the typed-number box beside it (the formula explorer's)."""
    readout = slider.locator(".widget-readout")
    if readout.count() and readout.first.is_visible():
        return readout.first.inner_text()
    return _number_box(slider).input_value()


def _move_slider(page, name: str, spec):
    """Move a slider one step with the keyboard; some text the kernel writes in its cell must change."""
    sliders = page.locator(".widget-slider")
    if spec.slider is not None:
        label = page.locator(".widget-label", has_text=re.compile(f"^{re.escape(spec.slider)}$"))
        sliders = sliders.filter(has=label)
    assert sliders.count() > 0, (f"{name}: no slider {spec.slider or ''} found; give the lab an "
                                 f"entry in tests/browser/lab_specs.py")
    slider = sliders.first
    cell = _cell_with(page, slider)
    before, shown = _kernel_text(cell), _slider_shown(slider)
    handle = slider.locator(".noUi-handle").first
    end = handle.get_attribute("aria-valuemax" if spec.key == "ArrowRight" else "aria-valuemin")
    key = spec.key
    if end is not None and handle.get_attribute("aria-valuenow") == end:  # already at that end: the other way
        key = "ArrowLeft" if spec.key == "ArrowRight" else "ArrowRight"
    handle.focus()
    page.keyboard.press(key)  # one step only: a second key press before the first shows would undo it
    _wait_for(lambda: _slider_shown(slider) != shown, 10, f"{name}: slider {spec.slider or '(first)'} did not move")
    _wait_for(lambda: _kernel_text(cell) != before, 30,
              f"{name}: moving slider {spec.slider or '(first)'} changed no readout")
    return cell


def _answer_quiz(page, name: str) -> None:
    """Pick the first option of the first multiple-choice question and press its check button."""
    questions = page.locator(".widget-vbox:has(> .widget-hbox .widget-radio-box)").filter(visible=True)
    assert questions.count() > 0, f"{name}: no multiple-choice quiz question on screen"
    question = questions.first
    question.locator(".widget-radio-box label").first.click()
    _button(question, "check").click()
    _wait_for(lambda: re.search(r"Correct\.|Not quite\.", _kernel_text(question)), 30,
              f"{name}: a quiz answer got no feedback")


def _press(page, name: str, press) -> None:
    """Click a button; its cell's kernel-written text must change, or match the spec's pattern."""
    what = press.label or press.selector
    for description, value in press.typed:
        _type_into_slider(page, description, value)
    button = (page.locator(press.selector) if press.selector else _button(page, press.label)).first
    cell = _cell_with(page, button)
    before = _kernel_text(cell)
    handle = button.element_handle()  # the same element when its text changes while it works
    button.focus()
    page.keyboard.press("Enter")  # as a learner with a keyboard only does (Tab reaches it: _keyboard_only)
    if press.busy:
        _wait_for(lambda: re.search(press.busy, handle.inner_text()) and handle.is_disabled(), 5,
                  f"{name}: {what} showed no sign of working (text {press.busy!r}, disabled) while it ran")
    if press.expect == "changes":
        _wait_for(lambda: _kernel_text(cell) != before, press.timeout_s, f"{name}: pressing {what} changed nothing")
    else:
        _wait_for(lambda: re.search(press.expect, _kernel_text(cell), re.S), press.timeout_s,
                  f"{name}: after {what}, no text matching {press.expect!r}; shown:\n{_kernel_text(cell)[:1500]}")
    _wait_for(button.is_enabled, press.timeout_s, f"{name}: {what} stayed disabled (its work never ended)")


def _slider(scope, description: str):
    """A slider on screen, by its description."""
    return scope.locator(".widget-slider").filter(has=_label(scope, description)).filter(visible=True).first


def _number_box(slider):
    """The number box beside a slider (the formula explorer's), where a value is typed."""
    return slider.locator("xpath=following-sibling::*[1]").locator("input")


def _type_into_slider(scope, description: str, value: str) -> None:
    """Type a value into a slider's readout (or the number box beside it), as a learner may; wait until the
    slider shows it."""
    slider = _slider(scope, description)
    readout = slider.locator(".widget-readout")
    if readout.count() and readout.first.is_visible():  # an ipywidgets slider's readout is editable text
        readout.first.click()
        slider.page.keyboard.press("Control+A")
        slider.page.keyboard.type(value)
        slider.page.keyboard.press("Enter")
    else:
        box = _number_box(slider)
        box.fill(value)
        box.press("Enter")
    _wait_for(lambda: _slider_shown(slider) == value, 10, f"slider {description} did not take the typed {value}")


def _label(scope, description: str):
    """A widget's description label, as an inner locator for `filter(has=...)` (built from the page)."""
    page = getattr(scope, "page", scope)
    return page.locator(".widget-label", has_text=re.compile(f"^{re.escape(description)}$"))


def _dropdown(scope, description: str):
    """The <select> of an ipywidgets Dropdown by its description, among those on screen."""
    label = _label(scope, description)
    return scope.locator(".widget-dropdown").filter(has=label).filter(visible=True).locator("select")


def _slider_step(scope, description: str, key: str = "ArrowRight") -> str:
    """Move a slider (on screen, by its description) one step with the keyboard; its new readout."""
    slider = _slider(scope, description)
    cell = _cell_with(slider.page, slider)
    shown, before = _slider_shown(slider), _kernel_text(cell)
    slider.locator(".noUi-handle").focus()
    slider.page.keyboard.press(key)
    _wait_for(lambda: _slider_shown(slider) != shown, 10, f"slider {description} did not move from {shown}")
    _wait_for(lambda: _kernel_text(cell) != before, 30, f"moving slider {description} changed no readout")
    return _slider_shown(slider)


PLOTS = """(cell, title) => [...cell.querySelectorAll('.js-plotly-plot')]
  .filter(g => g.offsetParent !== null && ((g.layout.title || {}).text || '').startsWith(title))
  .map(g => g.data.map(t => ({x: Array.from(t.x || []), y: Array.from(t.y || [])})))"""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _explorer_after_switching_entry(page, name: str) -> None:
    """Switch entry and back, switch formula, move a slider: the plot's dot and line follow the readout."""
    import content  # the same entries the lab shows

    entries = content.load_all()
    kv, other = entries["kv-cache"], entries["attention"]
    item = kv.science_item("KV cache per token")
    picker = _dropdown(page, "entry")
    cell = _cell_with(page, picker)
    for entry in (other, kv):
        picker.select_option(label=entry.name)
        _wait_for(lambda e=entry: cell.locator(".widget-html-content h3").first.inner_text() == e.name, 30,
                  f"{name}: selecting {entry.name} did not show its page")
    _dropdown(cell, "formula").select_option(label=item.title)
    readout = cell.locator(".widget-htmlmath-content").filter(has_text=item.title).filter(visible=True).first
    readout.wait_for()  # the kernel has rebuilt the controls for this formula
    x = next(iter(item.variables))
    description = f"{x} [{item.variables[x].unit}]"
    value = _number(_slider_step(cell, description))

    def agrees() -> bool:
        shown = re.findall(r"=\s*([\d,]+(?:\.\d+)?) B\b", readout.inner_text())
        plots = cell.evaluate(PLOTS, f"{item.title} vs {x}")
        if not shown or len(plots) != 1:
            return False
        (line, dot), result = plots[0], _number(shown[-1])
        if dot["x"] != [value] or dot["y"] != [result]:
            return False
        # the dot lies on the line: the formula is linear in its first variable, so interpolate
        k = next(i for i, v in enumerate(line["x"]) if v >= value)
        if line["x"][k] == value:
            return line["y"][k] == result
        x0, x1, y0, y1 = line["x"][k - 1], line["x"][k], line["y"][k - 1], line["y"][k]
        return abs(y0 + (y1 - y0) * (value - x0) / (x1 - x0) - result) <= 1e-9 * result

    def fail(what: str) -> str:
        return (f"{name}: after switching entry and formula and {what} {x} to {value:g}, the explorer's plot "
                f"does not show the readout ({readout.inner_text()[-200:]!r}; plot data "
                f"{str(cell.evaluate(PLOTS, item.title))[:600]})")

    _wait_for(agrees, 30, fail("moving"))
    # the box beside the slider: a typed value applies, the readout and the plot follow it
    box = _number_box(_slider(cell, description))
    value = value + 7
    box.fill(f"{value:g}")
    box.press("Enter")
    _wait_for(agrees, 30, fail("typing"))


def _decode_ratio_needs_equal_settings(page, name: str) -> None:
    """Decode with the cache at one batch (a press before this), without it at the next: no ratio is shown."""
    assert _slider_step(page, "concurrency B") == "2", f"{name}: the lab's batch did not start at B=1"
    # one new token: recomputing the prefix of the published model at B=2 for every token would take minutes
    tokens = _slider(page, "new tokens")
    tokens.locator(".noUi-handle").focus()
    page.keyboard.press("Home")
    _wait_for(lambda: _slider_shown(tokens) == "1", 10, f"{name}: the new-tokens slider did not go to 1")
    _press(page, name, Press(label="decode without cache", expect=r"No ratio: [^\n]*B=1 vs B=2"))
    stats = _kernel_text(_cell_with(page, _button(page, "decode without cache").first))
    assert "as long" not in stats, f"{name}: a ratio between B=1 and B=2 runs is shown:\n{stats[:1500]}"


def _stop_by_keyboard(page, name: str, control, start, stopped: str) -> None:
    """`start()`, a key on `control`, begins a long run; its stop button, pressed with Enter once offered, ends it
    with `stopped` said in the lab, and `control` takes keys again."""
    stop = _button(page, "stop").filter(visible=True).first
    cell = _cell_with(page, stop)
    start()
    _wait_for(stop.is_enabled, 30, f"{name}: the long run offered no stop button")
    stop.focus()
    page.keyboard.press("Enter")
    _wait_for(lambda: re.search(stopped, _kernel_text(cell)), 60,
              f"{name}: after stop, no text matching {stopped!r}; shown:\n{_kernel_text(cell)[:1500]}")
    _wait_for(stop.is_disabled, 30, f"{name}: the stop button stayed offered after the run ended")
    _when_enabled(control, f"{name}: after stop, {control}")


def _stop_new_sizes(page, name: str) -> None:
    """The diffusion lab: a new block size (a compile of seconds) moved to with the keyboard and stopped; the
    table's settings come back."""
    handle = _slider(page, "block size").locator(".noUi-handle")
    label = handle.get_attribute("aria-label")

    def move() -> None:
        handle.focus()
        at_end = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")

    _stop_by_keyboard(page, name, handle, move, r"Stopped before decoding gen length \d+, block \d+")
    _wait_for(lambda: handle.get_attribute("aria-label") == label, 10,
              f"{name}: after stop, the block size did not come back to {label!r}")


def _stop_the_timing(page, name: str) -> None:
    """The roofline lab: 'time this model here' pressed with Enter and stopped before its next timing."""
    button = _button(page, "time this model here").first

    def press() -> None:
        button.focus()
        page.keyboard.press("Enter")

    _stop_by_keyboard(page, name, button, press, r"Stopped after \d+ of \d+ timings")


def _stop_the_profile(page, name: str) -> None:
    """The roofline lab: a batch not profiled yet (one key on its slider), then 'where does a step's time go?'
    pressed with Enter and stopped before its next stage (it compiles for seconds first)."""
    handle = _slider(page, "batch B").locator(".noUi-handle")
    before = handle.get_attribute("aria-valuenow")
    handle.focus()
    page.keyboard.press("ArrowLeft" if before == handle.get_attribute("aria-valuemax") else "ArrowRight")
    _wait_for(lambda: handle.get_attribute("aria-valuenow") != before, 10, f"{name}: batch B did not move")
    _kernel_settled(page)
    button = _button(page, "where does a step's time go?").first

    def press() -> None:
        button.focus()
        page.keyboard.press("Enter")

    _stop_by_keyboard(page, name, button, press, r"Stopped the profile before")


FRONTIER_POINTS = """cell => {  // each point of the memory-savers frontier but the selection ring: label, centre
  const gd = [...cell.querySelectorAll('.js-plotly-plot')]
    .find(g => ((g.layout.title || {}).text || '').startsWith('Cache bytes vs quality'));
  gd.scrollIntoView({block: 'center'});
  const points = [];
  for (const el of gd.querySelectorAll('.scatterlayer .trace')) {
    const trace = el.__data__[0].trace;
    if (trace.index === gd.data.length - 1) continue;
    for (const p of el.querySelectorAll('path.point')) {
      const r = p.getBoundingClientRect();
      points.push({label: trace.text[p.__data__.i], x: r.x + r.width / 2, y: r.y + r.height / 2});
    }
  }
  return points;
}"""


def _point_click_selects(page, name: str) -> None:
    """The memory-savers frontier: clicking a point (one no other point is near) selects its configuration, as
    the dropdown does: the dropdown, the red ring and the readout follow."""
    picker = _dropdown(page, "configuration").first  # the tiny model's; the SmolLM2 section has its own below
    cell = _cell_with(page, picker)
    points = cell.evaluate(FRONTIER_POINTS)
    alone = [p for p in points if p["label"] != picker.input_value() and not any(
        q is not p and abs(q["x"] - p["x"]) < 15 and abs(q["y"] - p["y"]) < 15 for q in points)]
    assert alone, f"{name}: no point of the frontier stands clear of the others to be clicked"
    target = alone[0]
    page.mouse.move(target["x"], target["y"])  # plotly clicks the point it hovers: its label shows first
    _wait_for(lambda: cell.locator(".hoverlayer .hovertext").count() > 0, 10,
              f"{name}: hovering the point of {target['label']!r} showed no label")
    page.mouse.down()
    page.mouse.up()
    _wait_for(lambda: picker.input_value() == target["label"], 30,
              f"{name}: clicking the point of {target['label']!r} did not select it (selected: "
              f"{picker.input_value()!r})")
    _wait_for(lambda: target["label"] in _kernel_text(cell), 30,
              f"{name}: the readout does not name the clicked configuration {target['label']!r}")


LABEL_PROBLEMS = """() => {
  const problems = [];
  const texts = '.xtick text, .ytick text, .y2tick text, .legendtext, .gtitle, .g-xtitle, .g-ytitle, .g-y2title, '
    + '.g-x2title, .g-y3title, .annotation-text, .textpoint text, .gtitle-subtitle';
  for (const gd of document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot')) {
    if (gd.offsetParent === null || !(gd.data || []).length) continue;  // hidden, or no traces (default axes)
    const fig = gd.querySelector('.main-svg').getBoundingClientRect();
    const title = (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '(untitled)';
    const name = `${title.split('<br>')[0].slice(0, 60)} [${(gd.data || []).length} traces, `
      + `${Math.round(fig.width)}x${Math.round(fig.height)} px, cell ${[...document.querySelectorAll('.jp-CodeCell')]
          .indexOf(gd.closest('.jp-CodeCell'))}]`;
    const boxes = [...gd.querySelectorAll(texts)]
      .filter(e => e.textContent.trim() && e.getBoundingClientRect().width > 0)
      .map(e => ({text: e.textContent.trim().slice(0, 50), r: e.getBoundingClientRect()}));
    for (const b of boxes) {
      if (b.r.left < fig.left - 1 || b.r.right > fig.right + 1 || b.r.top < fig.top - 1 || b.r.bottom > fig.bottom + 1)
        problems.push(`${name}: '${b.text}' is cut off at the figure's edge`);
    }
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i].r, b = boxes[j].r;
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 2 && h > 2) problems.push(`${name}: '${boxes[i].text}' overlaps '${boxes[j].text}'`);
    }
  }
  for (const e of document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .widget-html-content')) {
    if (e.offsetParent !== null && e.scrollWidth > e.clientWidth + 2)
      problems.push(`a readout is wider than its box (${e.scrollWidth} > ${e.clientWidth} px): `
                    + e.textContent.trim().slice(0, 80));
  }
  return problems;
}"""


def _labels_clear(page, name: str) -> None:
    """Every plot's titles, ticks, legend entries and labels lie inside its figure and apart; no readout is
    wider than its box (cut off at the right)."""
    problems: list[str] = []

    def clear() -> bool:  # a plot being redrawn (a slider just moved) is briefly empty: wait for it to settle
        problems[:] = page.evaluate(LABEL_PROBLEMS)
        return not problems

    try:
        _wait_for(clear, 10, "labels")
    except AssertionError:
        pass
    assert not problems, f"{name}: labels cut off or on top of each other:\n" + "\n".join(problems[:20])


def _open(browser, jupyter, notebook: Path):
    """A fresh browser context with `notebook` opened in a fresh workspace, its kernel up: (context, page)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    workspace = f"{notebook.stem}-{secrets.token_hex(4)}"  # fresh: no tabs restored from another test
    page.goto(f"{jupyter.url}/lab/workspaces/{workspace}/tree/{notebook.name}?reset&token={jupyter.token}")
    page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for()
    _wait_for_kernel(page)
    return context, page


def _shows_no_broken_widget(page, visit: str) -> None:
    page.wait_for_timeout(2000)  # the widget manager restores (or fails to) once the kernel is up
    text = page.locator(".jp-NotebookPanel").inner_text()
    assert "Error displaying widget" not in text and "model not found" not in text, visit
    assert "children=(" not in text, f"{visit}: a widget's text repr is shown in its place"
    assert "A live widget goes here" in text, visit


def _reopens_after_save(page, notebook: Path, jupyter, browser) -> None:
    """Day two: the run lab saved from the menu, closed and reopened (kernel alive, then a new one) is not broken.

    The server is the learner's `dantinox lab`, so what is saved is the learner's copy, through its pre-save hook.
    """
    copy = jupyter.folder / notebook.name
    before = copy.stat().st_mtime_ns
    _menu(page, "File", "Save Notebook")
    _wait_for(lambda: copy.stat().st_mtime_ns != before, 30, f"{notebook.name}: the notebook was not saved")
    page.context.close()
    saved = json.loads(copy.read_text(encoding="utf-8"))
    assert all(c.get("execution_count") for c in saved["cells"] if c["cell_type"] == "code")  # this run, saved
    assert not [o for c in saved["cells"] for o in c.get("outputs", []) if WIDGET_MIME in o.get("data", {})], \
        f"{notebook.name}: saved with widget outputs whose state is not saved"
    for visit in ("reopened, its kernel still running", "reopened with a new kernel"):
        context, reopened = _open(browser, jupyter, notebook)
        try:
            _shows_no_broken_widget(reopened, f"{notebook.name} {visit}")
        finally:
            context.close()
        jupyter.shut_down_kernels()


RING_RIGHT = """import numpy as np

def ring_view(window, slots, length):
    s = np.arange(slots)
    held = s + slots * ((length - 1 - s) // slots)
    held = np.where(held >= 0, held, -1)
    return (length - 1) % slots, held, (held >= 0) & (length - 1 - held < window)
"""
RING_WRONG = RING_RIGHT.replace("< window)", "<= window)")  # a window of W + 1 keys


def _type_cell(page, marker: str, code: str) -> None:
    """Replace the source of the code cell holding `marker` with `code`, as typed, and run it (Shift+Enter)."""
    cell = page.locator(".jp-CodeCell").filter(has=page.locator(".cm-content", has_text=marker)).first
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(code)  # inserted as is: the editor's auto-indent would re-indent typed lines
    page.keyboard.press("Shift+Enter")
    _wait_for(lambda: re.fullmatch(r"\[\d+\]:", cell.locator(".jp-InputPrompt").inner_text().strip()), 30,
              f"the cell holding {marker!r} did not run")


def _exercise_typed_solution(page, name: str) -> None:
    """Exercise (d): a wrong ring_view typed into its cell is named with its misconception; a right one passes."""
    check = page.locator(".dx-exercise").filter(has_text="(d) A sliding-window ring buffer").first
    for code, expect in ((RING_WRONG, r"Not yet: d-ring-buffer: case \d+ of 8 .*that is the belief"),
                         (RING_RIGHT, r"Passed: d-ring-buffer: all 8 cases agree")):
        _type_cell(page, "def ring_view(", code)
        _button(check, "check my code").click()
        _wait_for(lambda expect=expect: re.search(expect, _kernel_text(check), re.S), 30,
                  f"{name}: after check my code, no verdict matching {expect!r}; shown: {_kernel_text(check)[:500]}")
    _button(check, "hint 1 of 3").click()
    _wait_for(lambda: "Hint 1:" in _kernel_text(check), 10, f"{name}: the hint button showed no hint")


TABBABLE = """() => {
  // per output, what a keyboard can reach in it, in page order, each marked with its place (data-kb); a named
  // radio group is one place (Tab enters a group once, the arrows move inside it); ipywidgets' radios have no
  // name: each is a Tab stop of its own
  const controls = '.noUi-handle, input, select, button, textarea, summary, a[href], [tabindex]';
  const outputs = [];
  let place = 0;
  for (const e of document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')) {
    const groups = new Map(), found = [];
    for (const c of e.querySelectorAll(controls)) {
      if (c.disabled || c.tabIndex < 0 || c.offsetParent === null || c.closest('.modebar')) continue;
      if (c.type === 'radio' && c.name && groups.has(c.name)) { c.dataset.kb = groups.get(c.name); continue; }
      c.dataset.kb = String(place++);
      if (c.type === 'radio' && c.name) groups.set(c.name, c.dataset.kb);
      found.push(c.dataset.kb);
    }
    // every Tab stop in it, ours or not (plotly's modebar has a dozen per plot): how many presses may cross it
    const stops = [...e.querySelectorAll(controls + ', [contenteditable=true]')].filter(c => c.tabIndex >= 0).length;
    if (found.length) outputs.push({index: outputs.length, first: found[0], places: found, stops});
  }
  return outputs;
}"""
LISTEN = """() => {  // the place (data-kb) of each element focused from now on, null once outside the outputs
  window.dantinoxFocus = [];
  window.dantinoxWalking = true;
  if (window.dantinoxListening) return;
  window.dantinoxListening = true;
  document.addEventListener('focusin', (event) => {
    const e = event.target;
    if (window.dantinoxWalking)
      window.dantinoxFocus.push(e.closest('.jp-OutputArea-output') ? (e.dataset.kb ?? '') : null);
  });
  // once out of the output, the presses left do nothing: in a cell's editor, Tab would indent its code
  window.addEventListener('keydown', (event) => {
    if (window.dantinoxWalking && event.key === 'Tab' && window.dantinoxFocus.includes(null)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);
}"""
DESCRIBE = "e => `${e.closest('.jp-OutputArea-output') ? '' : '(outside) '}${e.outerHTML.slice(0, 160)}`"
NUMBER_INPUTS = ".jp-NotebookPanel:not(.lm-mod-hidden) .widget-hbox:has(> .widget-slider + .widget-text)"


KERNEL_STATUS = "() => document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status"


def _kernel_settled(page, timeout_s: float = 60.0) -> None:
    """Until the kernel has been idle for three polls in a row: what the last key changed has been applied
    there, and whatever it rebuilds or disables (a toggle that disables the next dropdown) is on the page."""
    deadline, idle = time.monotonic() + timeout_s, 0
    while idle < 3:
        idle = idle + 1 if page.evaluate(KERNEL_STATUS) == "idle" else 0
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s: the kernel stayed busy")
        page.wait_for_timeout(100)


def _when_enabled(locator, what: str, timeout_s: float = 120.0) -> None:
    """Until a control takes keys again: a lab disables its controls while it recomputes."""
    _wait_for(lambda: not locator.is_disabled() and locator.get_attribute("aria-disabled") != "true", timeout_s,
              f"{what} stayed disabled")


def _press_until(page, control, key: str, moved, what: str, timeout_s: float = 10.0, tries: int = 3) -> None:
    """`key` on `control` until `moved()`. A lab holds its controls while a slow recomputation runs, from the
    moment it has run Lab.WORKING_AFTER_S: a key pressed just as that happens lands on a disabled control and
    is lost (as a learner's would be, the lab then saying it is working); press it again once it is enabled."""
    for attempt in range(tries):
        _when_enabled(control, what)
        control.focus()
        page.keyboard.press(key)
        try:
            _wait_for(moved, timeout_s, "")
            return
        except AssertionError:
            if attempt == tries - 1:
                raise AssertionError(f"waited {timeout_s:.0f} s, {tries} times: {what}") from None


def _tab_order(page, name: str) -> None:
    """In each output, Tab from its first control reaches every control in page order (between outputs
    JupyterLab's own keys move, and plotly's modebar is left out: each plot says what it shows under it)."""
    for output in page.evaluate(TABBABLE):
        page.locator(f"[data-kb='{output['first']}']").first.focus()
        page.evaluate(LISTEN)
        for _ in range(output["stops"] + 5):
            page.keyboard.press("Tab")
        reached = [output["first"]]
        for now in page.evaluate("() => { window.dantinoxWalking = false; return window.dantinoxFocus; }"):
            if now is None:  # left the output
                break
            if now and now != reached[-1]:
                reached.append(now)
        missed = [p for p in output["places"] if p not in reached]
        assert not missed, (f"{name}: in output {output['index']}, Tab does not reach {len(missed)} of "
                            f"{len(output['places'])} controls, first: "
                            + page.locator(f"[data-kb='{missed[0]}']").first.evaluate(DESCRIBE)
                            + f"; Tab reached {reached}")
        order = [p for p in reached if p in output["places"]]
        assert order == output["places"], (f"{name}: in output {output['index']}, Tab reaches the controls out of "
                                           f"page order: {order} for {output['places']}")


def _keyboard_only(page, name: str, there_and_back: bool = False) -> None:
    """A learner with a keyboard only, in every output of the lab: Tab reaches every control in page order; each
    slider moves with an arrow key, its name (what a screen reader reads) then saying the new value (with
    `there_and_back`, a lab that runs a slider's value once it settles, the key that moves it back follows at
    once: the walk costs that lab no run);
    each number box takes typing, and a value out of its range is refused in its line, a live region; each row of
    toggle buttons changes with Space and says which is chosen; each dropdown changes with an arrow key; a plot's
    data opens with Enter; the first quiz question is answered with Space and Enter and its verdict appears in a
    live region. (The lab's buttons are pressed with Enter by _press.)"""
    _tab_order(page, name)

    handles = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .noUi-handle")
    for i in range(handles.count()):
        handle = handles.nth(i)
        if not handle.is_visible():
            continue
        _when_enabled(handle, f"{name}: slider {i}")
        before, label = handle.get_attribute("aria-valuenow"), handle.get_attribute("aria-label") or ""
        assert label and "null" not in label, f"{name}: slider handle {i} has no name a screen reader can read"
        there = "ArrowLeft" if before == handle.get_attribute("aria-valuemax") else "ArrowRight"
        back = "ArrowRight" if there == "ArrowLeft" else "ArrowLeft"
        _press_until(page, handle, there, lambda h=handle, b=before: h.get_attribute("aria-valuenow") != b,
                     f"{name}: {label!r} did not move with {there}")
        _wait_for(lambda h=handle, t=label: (h.get_attribute("aria-label") or t) != t, 30,
                  f"{name}: {label!r} moved, but its name still says the old value")
        if there_and_back:
            there, there_label = handle.get_attribute("aria-valuenow"), handle.get_attribute("aria-label")
            for attempt in range(3):  # a loaded machine: the kernel's echo of a key can take seconds
                handle.focus()
                page.keyboard.press(back)
                try:
                    _wait_for(lambda h=handle, t=there: h.get_attribute("aria-valuenow") != t, 10, "")
                    break
                except AssertionError:  # the run it meant to avoid began first and holds the slider: after it
                    if attempt == 2:
                        raise AssertionError(f"{name}: {there_label!r} did not move back with {back}") from None
                    _when_enabled(handle, f"{name}: {there_label!r}")
            _wait_for(lambda h=handle, t=there_label: (h.get_attribute("aria-label") or t) != t, 30,
                      f"{name}: {there_label!r} moved back with {back}, but its name still says the old value")

    _kernel_settled(page)  # the last slider's recomputation has ended: no lab takes its controls while typing
    numbers = page.locator(NUMBER_INPUTS).filter(visible=True)
    for i in range(numbers.count()):
        number = numbers.nth(i)
        box, line = number.locator(".widget-text input"), number.locator("[role=status]")
        _when_enabled(box, f"{name}: number box {i}")
        kept = box.input_value()
        box.focus()
        page.keyboard.press("Control+A")
        page.keyboard.type("-5")
        page.keyboard.press("Enter")
        _wait_for(lambda ln=line: "expected" in " ".join(ln.all_inner_texts()), 30,
                  f"{name}: number box {i} ({box.get_attribute('aria-label')}) said nothing of a typed -5")
        _wait_for(lambda b=box, k=kept: b.input_value() == k, 10, f"{name}: number box {i} did not keep {kept}")

    rows = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-toggle-buttons").filter(visible=True)
    for i in range(rows.count()):
        buttons = rows.nth(i).locator("button.widget-toggle-button")
        chosen = next(k for k in range(buttons.count()) if buttons.nth(k).get_attribute("aria-pressed") == "true")
        for k in ((chosen + 1) % buttons.count(), chosen):  # another, then back
            button = buttons.nth(k)
            _press_until(page, button, "Space", lambda b=button: b.get_attribute("aria-pressed") == "true",
                         f"{name}: toggle row {i}: Space on {button.inner_text()!r} did not choose it")

    _kernel_settled(page)  # a toggle may have disabled a dropdown (MQA: one KV head) and enabled it again
    selects, i = page.locator(".jp-OutputArea-output select").filter(visible=True), -1
    while (i := i + 1) < selects.count():  # counted again each time: a dropdown may rebuild the ones after it
        select = selects.nth(i)
        # twice at most: the kernel may just be replacing this dropdown after the one before it changed (the
        # concept map's entry rebuilds its explorer), and a key pressed on the old one is lost
        for attempt in range(2):
            if select.is_disabled() or select.locator("option").count() < 2:
                break  # nothing to choose in the lab's present state
            options, before = select.locator("option").count(), select.input_value()
            index = select.evaluate("s => s.selectedIndex")
            select.focus()
            page.keyboard.press("ArrowUp" if index == options - 1 else "ArrowDown")
            try:
                _wait_for(lambda s=select, b=before: s.input_value() != b, 10, "")
                break
            except AssertionError:
                if attempt:
                    raise AssertionError(f"{name}: dropdown {i} did not change with an arrow key: " + select.evaluate(
                        "s => `${s.closest('.widget-dropdown').textContent.slice(0, 80)} ${s.outerHTML.slice(0, 200)}`"
                    )) from None
                _kernel_settled(page)

    data = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .dantinox-plot details").filter(visible=True)
    if data.count():
        data.first.locator("summary").focus()
        page.keyboard.press("Enter")
        _wait_for(lambda: data.first.locator(".dantinox-plot-data table").count() > 0, 10,
                  f"{name}: Enter on a plot's 'show data' showed no table")
        page.keyboard.press("Enter")

    questions = page.locator(".widget-vbox:has(> .widget-hbox .widget-radio-box)").filter(visible=True)
    if questions.count():
        question = questions.first
        group = question.locator(".widget-radio-box")
        assert group.get_attribute("role") == "radiogroup" and group.get_attribute("aria-labelledby"), \
            f"{name}: the quiz's choices are not a named group"
        question.locator(".widget-radio-box input").first.focus()
        page.keyboard.press("Space")  # choose the focused option
        options = question.locator(".widget-radio-box input").count()
        for _ in range(options):  # past the other options (each its own Tab stop) to "check"
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.textContent.trim()") == "check":
                break
        assert page.evaluate("() => document.activeElement.textContent.trim()") == "check", \
            f"{name}: Tab from the quiz's options does not reach its check button"
        page.keyboard.press("Enter")
        live = question.locator("[role=status][aria-live=polite]")
        _wait_for(lambda: re.search(r"Correct|Not quite", " ".join(live.all_inner_texts())), 30,
                  f"{name}: the keyboard's answer got no verdict in a live region")


SCENARIOS = {"explorer_after_switching_entry": _explorer_after_switching_entry,
             "exercise_typed_solution": _exercise_typed_solution,
             "decode_ratio_needs_equal_settings": _decode_ratio_needs_equal_settings,
             "labels_clear": _labels_clear, "stop_new_sizes": _stop_new_sizes, "stop_the_timing": _stop_the_timing,
             "stop_the_profile": _stop_the_profile,
             "point_click_selects": _point_click_selects}


def notebooks(share: int) -> list[Path]:
    """The labs of one share: pass them to pytest.mark.parametrize (ids: their stems)."""
    return [p for p in NOTEBOOKS if SHARE.get(p.stem) == share]


def run_lab(notebook: Path, jupyter, browser, tmp_path: Path) -> None:
    """The whole check of one lab in a fresh browser context (see the module's docstring)."""
    spec, source = spec_for(notebook.stem), notebook.read_text(encoding="utf-8")
    shipped = notebook.read_bytes()
    context, page = _open(browser, jupyter, notebook)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    try:
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()  # fold the file browser away
        if spec.reopen:  # the learner's copy as first opened: saved widget outputs replaced, nothing broken
            _shows_no_broken_widget(page, f"{notebook.name} first visit")
        _menu(page, "Edit", "Clear Outputs of All Cells")  # saved outputs would look like a finished run
        run_all_cells(page, notebook.name)
        page.wait_for_function(ALL_RAN, timeout=RUN_ALL_TIMEOUT_S * 1000, polling=500)

        errors = [t for t in page.locator(STDERR).all_inner_texts() if re.search(r"Traceback|\w+Error\b", t)]
        assert not errors, f"{notebook.name}: error output after Run All:\n" + "\n".join(errors)[:3000]
        prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt").all_inner_texts()
        code_cells = [c for c in json.loads(source)["cells"] if c["cell_type"] == "code"]
        hidden = {i for i, c in enumerate(code_cells) if c["metadata"].get("jupyter", {}).get("source_hidden")}
        # a collapsed input shows no prompt; a hidden cell that failed shows its traceback (above) and stops the rest
        unrun = [i for i, t in enumerate(prompts)
                 if i not in hidden and not re.fullmatch(r"\[\d+\]:", t.strip())]
        assert not unrun, f"{notebook.name}: code cells {unrun} did not run"
        widgets = page.locator(WIDGET_OUTPUT)
        expected = sum(WIDGET_MIME in output.get("data", {}) for cell in json.loads(source)["cells"]
                       for output in cell.get("outputs", []))  # as committed, after the lead's last run
        assert widgets.count() >= expected, f"{notebook.name}: {widgets.count()} of {expected} widgets rendered"
        if expected:
            _wait_for(lambda: "Loading widget" not in " ".join(widgets.all_inner_texts()), 30,
                      f"{notebook.name}: a widget never finished loading")
            for i in range(widgets.count()):
                box = widgets.nth(i).bounding_box()
                assert box and box["height"] > 10, f"{notebook.name}: widget output {i} is empty on screen"
            broken = [t for t in widgets.all_inner_texts() if "Error displaying widget" in t]
            assert not broken, f"{notebook.name}: {broken[0][:300]}"
        axe.wait_until_started(page)  # every plot drawn: its bundle loads once the page is idle
        if "plotly" in source:
            assert page.locator(".js-plotly-plot .main-svg").count() > 0, f"{notebook.name}: no plot drawn"
        inaccessible = axe.project_violations(page, f"{notebook.name} after Run All")

        if spec.interactive:
            slider_cell = _move_slider(page, notebook.name, spec) if spec.has_slider else None
            if spec.quiz:
                _answer_quiz(page, notebook.name)
            for press in spec.presses:
                _press(page, notebook.name, press)
            for scenario in spec.scenarios:
                SCENARIOS[scenario](page, notebook.name)
        else:
            slider_cell = _cell_with(page, page.locator(".js-plotly-plot").first)

        if os.environ.get("DANTINOX_SCREENSHOTS") == "1":  # about 1 s a lab: only when the docs' are rewritten
            shot = (_cell_with(page, page.get_by_text(spec.screenshot, exact=True).first) if spec.screenshot
                    else slider_cell)
            _save_screenshot(shot, notebook.stem, SCREENSHOTS)  # before the keyboard walk leaves its marks
        if spec.interactive:
            _keyboard_only(page, notebook.name, spec.settles)
            inaccessible += axe.project_violations(page, f"{notebook.name} after its presses, scenarios and keys")
        assert not problems, f"{notebook.name}: browser console errors:\n" + "\n".join(problems)[:3000]
        assert not inaccessible, (f"{notebook.name}: axe-core finds serious or critical accessibility problems in "
                                  f"the outputs:\n" + "\n".join(inaccessible)[:4000])
        if spec.reopen:
            _reopens_after_save(page, notebook, jupyter, browser)
        assert notebook.read_bytes() == shipped, f"{notebook.name}: the tracked lab was rewritten"
    except Exception:
        if not page.is_closed():
            page.screenshot(path=tmp_path / "failure.png", full_page=True)
        print(f"screenshot of the page at the failure: {tmp_path / 'failure.png'}")
        raise
    finally:
        context.close()  # already closed when the lab was reopened: closing again does nothing
        jupyter.shut_down_kernels()
