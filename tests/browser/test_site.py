"""The course site (`python3 dev.py site`): built, served from one local origin, and run in Chromium on Pyodide.

Chromium runs with every host but 127.0.0.1 unresolvable (host-resolver rules: requests a service worker makes
are covered too), and every request the page makes outside the site's origin is recorded and refused. The concept
map notebook runs every cell in the browser's kernel; the formula explorer's check prints the numbers the desktop
computes; a slider moved with the keyboard changes the plot's data; a quiz answer is graded as the desktop grades
it; the lab's own browser checks follow (lab_specs.py: a slider, the press that loads a published spec, switching
entries in the explorer), which is why JupyterLab does not run this lab a second time; and after a page reload (a
new kernel) the quiz shows its answer again from the browser's own storage.

    .venv/bin/python -m pytest tests/browser/test_site.py -q -p no:cacheprovider
"""

from __future__ import annotations

import functools
import http.server
import re
import threading
import time
from pathlib import Path

import axe
import pytest
from lab_run import SCENARIOS, _keyboard_only, _move_slider, _press, _wait_for, run_all_cells
from lab_specs import spec_for

import content
from dantinox_labs import site
from widgets import FormulaExplorer
from widgets.browser_store import STORAGE_KEY

NAME = "concepts.ipynb in the site"
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
PROMPTS = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
KERNEL_STATUS = "() => document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status')"
POINT_X = """cell => [...cell.querySelectorAll('.js-plotly-plot')].map(g => g.data.map(t => Array.from(t.x || [])))"""


class _Files(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".js": "text/javascript", ".wasm": "application/wasm"}

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The site, built from this checkout (downloads come from .venv/site-cache), on a local static server."""
    try:
        out = site.build(tmp_path_factory.mktemp("site") / "site")
    except site.SiteError as err:  # no registry on a first build: one line, not a traceback
        pytest.fail(str(err), pytrace=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", out
    server.shutdown()


@pytest.fixture(scope="module")
def isolated_browser(browser, chromium_path):
    """A second Chromium from the session's Playwright, with no host but 127.0.0.1 resolvable."""
    offline = browser.browser_type.launch(executable_path=chromium_path, args=[
        "--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
    yield offline
    offline.close()


def _kernel_ready(page, timeout_s: float = 120) -> None:
    page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
    deadline = time.monotonic() + timeout_s
    while page.evaluate(KERNEL_STATUS) != "idle":
        dialog = page.locator(".jp-Dialog .jp-mod-accept")
        if dialog.count():  # a fresh site may ask which kernel to start: take the one it proposes
            dialog.first.click()
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s: the Pyodide kernel did not start"
        page.wait_for_timeout(250)


def _ran(page, cells: int) -> bool:
    prompts = page.evaluate(PROMPTS)
    return sum(bool(re.fullmatch(r"\[\d+\]:", p)) for p in prompts) >= cells and not any("*" in p for p in prompts)


def _run_all(page) -> None:
    """Run All from the menu (lab_run.run_all_cells), then wait until every cell has run. (Clearing the outputs
    first from the Edit menu, as the JupyterLab test does, found no such menu item after the reload in one run
    here, 2026-12-04.)"""
    run_all_cells(page, NAME)
    cells = len(page.evaluate(PROMPTS))
    try:
        _wait_for(lambda: _ran(page, cells), 180, "Run All did not finish")
    except AssertionError as err:  # say where it stopped: the prompts, the kernel's state, what a cell printed
        raise AssertionError(f"{err}; {cells} cells, prompts {page.evaluate(PROMPTS)}, "
                             f"kernel {page.evaluate(KERNEL_STATUS)!r}, "
                             f"errors {_errors(page)[:2]}") from None


def _errors(page) -> list[str]:
    return page.locator(STDERR).all_inner_texts()


def _reference_numbers() -> tuple[str, str]:
    """What the explorer's check cell prints on the desktop (the same code, CPython here, Pyodide there)."""
    entries = content.load_all()
    reading = FormulaExplorer(entries["paged-attention"], science="Wasted share of the allocation").set(T=1000, P=16)
    return f"{reading.science}: {reading.substituted} = {reading.result_text}", "gives the same number: True"


def test_concept_map_course_runs_in_the_browser_from_the_site_alone(served, isolated_browser):
    base, out = served
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    context = isolated_browser.new_context(viewport={"width": 1200, "height": 900})
    outside, fetched = [], []

    def route(request_route):
        url = request_route.request.url
        if url.startswith(base + "/"):
            request_route.continue_()
        else:
            outside.append(url)
            request_route.abort("namenotresolved")

    context.route("**/*", route)
    page = context.new_page()
    unresolved, console_errors = [], []  # a request no route saw (a service worker's) fails to resolve: console
    page.on("console", lambda m: (unresolved if "ERR_NAME_NOT_RESOLVED" in m.text else console_errors).append(
        m.text) if m.type == "error" else None)
    page.on("response", lambda r: fetched.append(int(r.headers.get("content-length", 0))))
    try:
        page.goto(f"{base}/lab/index.html?path=concepts.ipynb")
        _kernel_ready(page)
        _run_all(page)
        assert _errors(page) == []
        code = page.locator(".jp-CodeCell")
        check_text = code.nth(3).locator(".jp-OutputArea-output").inner_text()
        for line in _reference_numbers():
            assert line in check_text, f"the explorer's check printed\n{check_text}\nnot {line!r}"
        # The explorer's plot drawn before axe holds the page: its widgets may still be arriving from the kernel
        # (no count of expected outputs here, as lab_run.py has), and a model that arrives meanwhile misses its 2 s
        explorer = code.nth(2)
        _wait_for(lambda: explorer.locator(".js-plotly-plot").count() > 0, 30, "the explorer's plot is not drawn")
        inaccessible = axe.project_violations(page, f"{NAME} after Run All")

        # The explorer: one keyboard step on a slider changes the plot's data (the kernel recomputed it).
        before = explorer.evaluate(POINT_X)
        handle = explorer.locator(".widget-slider .noUi-handle").first
        handle.focus()
        page.keyboard.press("ArrowRight")
        _wait_for(lambda: explorer.evaluate(POINT_X) != before, 30, "a slider step did not change the plot's data")

        # The quiz: the first choice question, first option, graded as the desktop grades it.
        attention = content.load_all()["attention"]
        index = next(i for i, c in enumerate(attention.checks) if c.kind == "choice")
        verdict = "Correct." if content.is_correct(attention, index, 0) else "Not quite."
        quiz = code.last
        question = quiz.locator(".widget-vbox:has(> .widget-hbox .widget-radio-box)").first
        question.locator(".widget-radio-box label").first.click()
        question.locator("button.widget-button", has_text="check").click()
        _wait_for(lambda: verdict in question.inner_text(), 30, f"the quiz answer was not graded {verdict!r}")
        _wait_for(lambda: page.evaluate(f"() => (localStorage.getItem({STORAGE_KEY!r}) || '').includes('attention')"),
                  10, "the answer is not in the browser's storage")

        # What the JupyterLab test does in a lab (lab_specs.py): this lab runs in a browser here, not there.
        spec = spec_for("concepts")
        assert spec.in_site
        _move_slider(page, NAME, spec)
        for press in spec.presses:
            _press(page, NAME, press)
        for scenario in spec.scenarios:
            SCENARIOS[scenario](page, NAME)
        _keyboard_only(page, NAME)
        inaccessible += axe.project_violations(page, f"{NAME} after its presses and scenarios")
        assert not inaccessible, ("axe-core finds serious or critical accessibility problems in the outputs:\n"
                                  + "\n".join(inaccessible)[:4000])

        # A reload is a new kernel: the stored answer comes back from the page's storage.
        first_visit = sum(fetched)
        page.reload()
        _kernel_ready(page)
        code = page.locator(".jp-CodeCell")
        # Run All, as on the first visit: running the imports and the quiz cell alone, by a click and
        # Ctrl+Enter each, left a cell unrun or its widget undrawn in 3 of 9 runs here (2026-12-03)
        _run_all(page)
        assert _errors(page) == []
        question = code.last.locator(".widget-vbox:has(> .widget-hbox .widget-radio-box)")
        _wait_for(lambda: "Your earlier answer" in question.first.inner_text(), 30,
                  "after a reload the quiz does not show the stored answer")
        assert verdict in question.first.inner_text()
    finally:
        context.close()
    assert outside == [] and unresolved == [], f"requests left the site's origin: {outside[:5]} {unresolved[:5]}"
    assert console_errors == [], f"the browser console reported errors: {console_errors[:5]}"
    print(f"site: {size / 2**20:.1f} MiB on disk; the first visit fetched {first_visit / 2**20:.1f} MiB")
    assert first_visit < 50 * 2**20


def test_every_lab_runs_in_a_browser_once():
    """Each lab is run in JupyterLab (one of the two shares) or, if its spec says so, here in the site."""
    from lab_run import NOTEBOOKS, SHARE
    from lab_specs import spec_for

    in_site = {p.stem for p in NOTEBOOKS if spec_for(p.stem).in_site}
    assert in_site == {"concepts"}, f"test_site.py runs concepts.ipynb only, not {sorted(in_site)}"
    assert {f"{stem}.ipynb" for stem in in_site} <= set(site.NOTEBOOKS)
    assert set(SHARE) | in_site == {p.stem for p in NOTEBOOKS} and not set(SHARE) & in_site

