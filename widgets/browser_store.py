"""Quiz answers kept in the browser's own storage, for the course site where the kernel runs in the page (Pyodide).

    store = browser_store()          # one per kernel; the quiz picks it itself when it runs under Pyodide
    store.add(attempt); store.attempts("pyodide", "kv-cache"); store.reset("pyodide", "kv-cache")

The kernel lives in a Web Worker, which has no `localStorage`, and SQLite on the site's synced drive fails
("disk I/O error"). So a widget with no view of its own holds the answers: when its model is created in the
page, its front-end half reads the site's `localStorage` and sends the stored attempts to the kernel; every new
attempt or reset is sent back and written there at once. Until the stored attempts arrive (just after the cell
that made the widget has run), `attempts` has only this session's; listeners are told when they arrive. Like
`classroom.store.AnswerStore`, a reset hides attempts and never deletes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

from classroom.store import Attempt

STORAGE_KEY = "dantinox-labs/answers/v1"  # one localStorage item per site origin

_ESM = "const KEY = " + repr(STORAGE_KEY) + ";\n" + """
function read() {
  try { const rows = JSON.parse(localStorage.getItem(KEY) || "[]"); return Array.isArray(rows) ? rows : []; }
  catch (err) { console.error("dantinox-labs: stored answers unreadable, starting afresh", err); return []; }
}
function write(rows) {
  try { localStorage.setItem(KEY, JSON.stringify(rows)); return ""; }
  catch (err) { return String(err); }  // storage full or disabled: the kernel says so under the quiz
}
export default {
  initialize({ model }) {
    model.set("stored", read());
    model.set("loaded", true);
    model.save_changes();
    model.on("msg:custom", (msg) => {
      const rows = read();
      if (msg.add && !rows.some((r) => r.key === msg.add.key)) rows.push({ ...msg.add, hidden: false });
      if (msg.reset) {
        for (const r of rows) if (r.learner === msg.reset.learner && r.entry_id === msg.reset.entry_id) r.hidden = true;
      }
      const error = write(rows);
      if (error) { model.set("error", error); model.save_changes(); }
    });
  },
  render() {},
};
"""


class BrowserAnswerStore(anywidget.AnyWidget):
    """The answer store's interface (add, attempts, reset, pending, refused) over the page's localStorage."""

    _esm = _ESM
    stored = traitlets.List().tag(sync=True)  # what the page had stored, sent once by the front end
    loaded = traitlets.Bool(False).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)  # the last write the page could not make
    path = f"this browser's storage for this site (localStorage {STORAGE_KEY!r})"
    # what the quiz's "show my answers" says about getting them out: the site has no command line
    export_hint = ("they are kept in this browser's storage for this site (clearing the site's data deletes "
                   "them); <code>to_json()</code> on this quiz, in a cell, gives them as JSON")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._rows: list[dict[str, Any]] = []  # attempt JSON plus "hidden"
        self._listeners: list[Callable[[], None]] = []
        self.observe(self._on_stored, names="stored")

    def _on_stored(self, change: dict) -> None:
        seen, rows = set(), []
        for row in [*change["new"], *self._rows]:  # stored first, then any answered before they arrived
            try:
                attempt = Attempt.from_json({k: v for k, v in row.items() if k != "hidden"})
            except (ValueError, TypeError, AttributeError):
                continue  # a row this version cannot read is left in storage, not shown
            if attempt.key not in seen:
                seen.add(attempt.key)
                rows.append({**attempt.to_json(), "hidden": bool(row.get("hidden"))})
        self._rows = rows
        for listener in list(self._listeners):
            listener()

    def on_load(self, listener: Callable[[], None]) -> None:
        """Call `listener` when the stored attempts arrive from the page."""
        self._listeners.append(listener)

    def add(self, attempt: Attempt, *, outbox: bool = False) -> bool:
        if any(r["key"] == attempt.key for r in self._rows):
            return False
        row = attempt.to_json()
        self._rows.append({**row, "hidden": False})
        self.send({"add": row})
        return True

    def attempts(self, learner: str, entry_id: str) -> list[Attempt]:
        """The learner's attempts at the entry since their last reset, oldest first."""
        rows = [r for r in self._rows if r["learner"] == learner and r["entry_id"] == entry_id and not r["hidden"]]
        rows.sort(key=lambda r: r["time"])
        return [Attempt.from_json({k: v for k, v in r.items() if k != "hidden"}) for r in rows]

    def reset(self, learner: str, entry_id: str) -> int:
        hidden = 0
        for r in self._rows:
            if r["learner"] == learner and r["entry_id"] == entry_id and not r["hidden"]:
                r["hidden"], hidden = True, hidden + 1
        self.send({"reset": {"learner": learner, "entry_id": entry_id}})
        return hidden

    def pending(self) -> list:
        return []  # no classroom service in the browser: nothing waits for delivery

    def refused(self) -> list:
        return []


_STORE: BrowserAnswerStore | None = None


def browser_store() -> BrowserAnswerStore:
    """The kernel's one browser store (every quiz shares it, so the page's storage is read once)."""
    global _STORE
    if _STORE is None:
        _STORE = BrowserAnswerStore()
    return _STORE
