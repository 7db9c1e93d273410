"""The instructor dashboard: the summary the service serves as JSON, and the page that polls it.

The numbers come from `classroom.summary` (the instructor notebook calls the same functions). The page
builds every cell with `textContent`, so question text, option text and learner names are never parsed as
HTML, whatever an entry or a hub user name contains.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from classroom.summary import Tally, exercise_rows, learner_rows, question_rows

POLL_MS = 3000  # how often an open dashboard asks for fresh numbers during a session


def dashboard_page(xsrf_token: str) -> str:
    """The dashboard HTML with the XSRF token its requests must carry (escaped for an attribute)."""
    from html import escape

    return DASHBOARD_HTML.replace("{xsrf}", escape(xsrf_token, quote=True))


def class_summary(attempts: Tally | list, entries: Mapping[str, Any] | None) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON: per question, per learner, and totals."""
    tally = attempts if isinstance(attempts, Tally) else Tally(attempts)
    return {"questions": question_rows(tally, entries), "learners": learner_rows(tally, entries),
            "exercises": exercise_rows(tally),
            "attempts": tally.total, "learner_count": len(tally.learners), "generated": time.time()}


DASHBOARD_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Classroom dashboard</title>
<meta name="xsrf" content="{xsrf}">
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.key { color: #0a6b2d; font-weight: 600; } .muted { color: #777; } .bar { background: #c6dbef; height: .8em; }
</style></head>
<body>
<h1>Classroom dashboard</h1>
<p class="muted">Measured: every attempt recorded by the classroom service. A learner's first attempt at a
question counts for the first-try rate and for the option they chose. Updates every POLL_SECONDS s.
<span id="status"></span></p>
<p>Export: <a href="api/attempts?format=csv">attempts CSV</a> · <a href="api/attempts?format=json">attempts
JSON</a> · <a href="api/summary">summary JSON</a></p>
<h2>Per question</h2><div id="questions"></div>
<h2>Per exercise</h2>
<p class="muted">Reported by each learner's kernel: the service records who checked and when, but does not re-run
their code (nbgrader's hidden tests do).</p><div id="exercises"></div>
<h2>Per learner</h2><div id="learners"></div>
<script>
"use strict";
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);  // text only: content is never parsed as HTML
  if (cls) e.className = cls;
  return e;
}
function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}
function table(head, rows) {
  const t = el("table"), h = el("tr");
  for (const name of head) h.appendChild(el("th", name));
  t.appendChild(h);
  for (const r of rows) t.appendChild(r);
  return t;
}
function pct(x) { return (100 * x).toFixed(0) + "%"; }
function num(x) { return el("td", x, "n"); }
function questions(rows) {
  const out = [];
  for (const q of rows) {
    out.push(row([el("td", q.entry + " #" + q.check), el("td", q.question || ""), num(q.learners),
                  num(q.attempts), num(pct(q.first_try_rate))]));
    for (const o of q.options || []) {
      const share = q.learners ? o.first_choice / q.learners : 0, bar = el("div", null, "bar");
      bar.style.width = (8 * share) + "em";
      const opt = el("td", (o.correct ? "\\u2713 " : "") + o.option, o.correct ? "key" : "");
      const td = el("td"); td.appendChild(bar);
      out.push(row([el("td", ""), opt, num(o.first_choice), td,
                    el("td", o.correct ? "the keyed answer" : "believes: " + o.belief, "muted")]));
    }
  }
  return table(["question", "text / option", "learners", "attempts", "first try right"], out);
}
function learners(rows) {
  return table(["learner", "answered", "first try right", "progress per entry"], rows.map(l => row([
    el("td", l.learner), num(l.answered), num(l.first_try_right),
    el("td", Object.entries(l.entries).map(([e, n]) => e + ": " + n).join(", "))])));
}
function exercises(rows) {
  return table(["exercise", "learners", "checks", "passed", "passed by", "not yet", "commonest mistake"],
    rows.map(x => row([el("td", x.title), num(x.learners), num(x.checks), num(x.passed),
      el("td", x.passed_by.join(", ")), el("td", x.not_yet.join(", "), "muted"),
      el("td", x.commonest_mistake ? x.commonest_mistake + " (" + x.commonest_mistake_learners + ")" : "")])));
}
async function refresh() {
  const status = document.getElementById("status");
  try {
    const xsrf = document.querySelector("meta[name=xsrf]").content;  // the hub's XSRF check on cookie requests
    const r = await fetch("api/summary", {credentials: "same-origin", cache: "no-store",
                                          headers: {"X-XSRFToken": xsrf}});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    document.getElementById("questions").replaceChildren(questions(s.questions));
    document.getElementById("learners").replaceChildren(learners(s.learners));
    document.getElementById("exercises").replaceChildren(exercises(s.exercises));
    status.textContent = s.attempts + " attempts from " + s.learner_count + " learners, updated " +
      new Date(s.generated * 1000).toLocaleTimeString() + "." +
      (s.content_error ? " Question text unavailable: content did not load (" + s.content_error + ")." : "");
  } catch (err) {
    status.textContent = "Could not refresh (" + err.message + "); retrying.";
  }
}
refresh();
setInterval(refresh, POLL_MS);
</script></body></html>
""".replace("POLL_SECONDS", str(POLL_MS // 1000)).replace("POLL_MS", str(POLL_MS))
