"""axe-core in the page the browser tests already have open: WCAG 2.1 A/AA rules, serious and critical only.

The script is the copy `axe-playwright-python` (a dev dependency) ships, read from the installed package, so no
request leaves the machine. `project_violations(page)` checks the notebook's output areas only (what the labs
draw); JupyterLab's own chrome is not ours, and `chrome_violations(page)` reports it for docs/accessibility.md.

    DANTINOX_AXE_REPORT=1 .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider -k mesh  # print counts
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

OUTPUTS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output"
RULES = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BLOCKING = ("serious", "critical")
RUN = """async ([context, rules]) => {
  const results = await axe.run(context, {runOnly: {type: 'tag', values: rules}, resultTypes: ['violations']});
  return {version: axe.version, violations: results.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map(n => ({target: n.target.join(' '), summary: n.failureSummary.slice(0, 300),
                              html: n.html.slice(0, 200)}))}))};
}"""


@functools.cache
def script() -> str:
    """axe.min.js from the installed axe-playwright-python (the set-up's own copy)."""
    import axe_playwright_python

    return (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text(encoding="utf-8")


def run(page, context) -> dict:
    """axe's WCAG 2.1 A/AA violations in `context` (an axe context: selectors to include/exclude)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(script())
    return page.evaluate(RUN, [context, RULES])


def serious(result: dict) -> list[str]:
    """One line per element with a serious or critical violation."""
    return [f"{v['impact']} {v['id']} ({v['help']}): {n['target']}: {n['summary']} | {n['html']}"
            for v in result["violations"] if v["impact"] in BLOCKING for n in v["nodes"]]


STARTING = """() => [...document.querySelectorAll('.dantinox-aria, .dantinox-plot')]
  .filter(e => !('dantinoxStarted' in e.dataset)).length"""


def wait_until_started(page, timeout_s: float = 30.0) -> None:
    """Until every widget of the project drawn with anywidget has started (an Aria) or drawn (a plot): axe holds
    the page's only thread for 1-3 s, and anywidget fails a model that has not started within 2 s of arriving."""
    deadline = time.monotonic() + timeout_s
    while (waiting := page.evaluate(STARTING)) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert not waiting, f"{waiting} plot or Aria widget(s) on the page never started or drew in {timeout_s:.0f} s"


def project_violations(page, when: str) -> list[str]:
    """The serious and critical violations inside the open notebook's outputs (the project's own HTML)."""
    wait_until_started(page)
    start = time.monotonic()
    found = serious(run(page, {"include": [[OUTPUTS]]}))
    if os.environ.get("DANTINOX_AXE_REPORT") == "1":
        print(f"axe {when}: {len(found)} serious/critical in the outputs ({time.monotonic() - start:.2f} s)")
        for line in found:
            print("   ", line)
        for v in chrome_violations(page):  # JupyterLab's own: listed in docs/accessibility.md, not failed on
            print(f"    chrome: {v['impact']} {v['id']} ({v['help']}) x{len(v['nodes'])}: "
                  + "; ".join(n["target"] for n in v["nodes"][:4]))
    return [f"{when}: {line}" for line in found]


def chrome_violations(page) -> list[dict]:
    """Every violation axe reports in the page outside the notebook's outputs: JupyterLab's own chrome."""
    return run(page, {"exclude": [[".jp-OutputArea-output"]]})["violations"]
