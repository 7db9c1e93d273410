"""The concept card: one content entry shown as a page, every text escaped, equations in LaTeX.

    ConceptCard(content.load_entry("kv-cache"))

Any entry works (entry in, widget out). Text from YAML is always passed through html.escape, so markup in
content shows as text; a link gets an href only when its URL is http(s).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

import content
from widgets._html import badge, esc, link


def _section(title: str, body_html: str) -> str:
    return f"<h4 style='margin:10px 0 4px 0'>{esc(title)}</h4>{body_html}"


def _para(text: str) -> str:
    return f"<p style='margin:2px 0'>{esc(text)}</p>"


def science_html(item: Any) -> str:
    """A science item: its equation (LaTeX, for HTMLMath), variables, explanation and assumptions."""
    variables = "".join(f"<li><code>{esc(name)}</code>: {esc(v.meaning)} [{esc(v.unit)}]</li>"
                        for name, v in item.variables.items())
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in item.assumptions)
    return (f"<div style='margin:6px 0'><b>{esc(item.title)}</b> (result in {esc(item.unit)})"
            f"<div>$${esc(item.equation)}$$</div>{_para(item.explanation)}"
            f"<div>Variables:<ul style='margin:2px 0'>{variables}</ul></div>"
            f"<div>Assumptions:<ul style='margin:2px 0'>{assumptions}</ul></div></div>")


BELIEF_LINKS = {"belief": "where this belief appears", "fix": "the fix of this belief"}


def spec_html(entry: Any, spec: Any) -> str:
    kind = badge("derived", "computed by content") if spec.compute is not None else ""
    source = f" ({link('source', spec.source)})" if spec.source else ""
    value = content.spec_value(entry, spec)
    presets = content.device_inputs(spec)
    named = f"<br><small>{esc(presets)}</small>" if presets else ""
    return f"<li><b>{esc(spec.label)}</b>: {esc(value)} {kind}<br>{esc(spec.context)}{source}{named}</li>"


def misconception_html(m: Any) -> str:
    """One belief, struck through, its correction and its two links (the first says what the page shows)."""
    return (f"<li><s>{esc(m.claim)}</s><br>{esc(m.correction)} ({link(BELIEF_LINKS[m.shows], m.appears_in)};"
            f" {link('corrected by', m.corrected_by)})</li>")


class ConceptCard(widgets.VBox):
    """Role, description, mechanism, equations, trade-off, misconceptions, history and sources of an entry.

    `sections` maps each heading to its widget, so tests and other labs can read or re-arrange them.
    """

    def __init__(self, entry: Any):
        self.entry = entry
        mechanism = "".join(f"<li>{esc(step)}</li>" for step in entry.mechanism)
        misconceptions = "".join(misconception_html(m) for m in entry.misconception)
        history = "".join(f"<li><b>{esc(h.year)}</b>, {link(h.title, h.source)}: {esc(h.significance)}</li>"
                          for h in entry.history)
        sources = "".join(f"<li>{link(s.title, s.url)}</li>" for s in entry.sources)
        specs = "".join(spec_html(entry, s) for s in getattr(entry, "specs", []))
        header = (f"<h3 style='margin:4px 0'>{esc(entry.name)} ({esc(entry.short_name)})</h3>"
                  f"<p style='margin:2px 0'><i>After this lab you can:</i> {esc(entry.learning_objective)}</p>")
        self.sections: dict[str, widgets.Widget] = {
            "header": widgets.HTML(header),
            "role": widgets.HTML(_section("Role", _para(entry.role))),
            "description": widgets.HTML(_section("What it is", _para(entry.description))),
            "mechanism": widgets.HTML(_section("How it works", f"<ol style='margin:2px 0'>{mechanism}</ol>")),
            "equations": widgets.HTMLMath(_section("Equations", "".join(science_html(s) for s in entry.science))),
            "specs": widgets.HTML(_section("Key numbers", f"<ul style='margin:2px 0'>{specs}</ul>")),
            "tradeoff": widgets.HTML(_section("Trade-off", _para(entry.tradeoff))),
            "misconception": widgets.HTML(_section("Common misconceptions",
                                                   f"<ul style='margin:2px 0'>{misconceptions}</ul>")),
            "history": widgets.HTML(_section("History", f"<ul style='margin:2px 0'>{history}</ul>")),
            "sources": widgets.HTML(_section("Sources", f"<ul style='margin:2px 0'>{sources}</ul>")),
        }
        if not specs:
            del self.sections["specs"]
        super().__init__(list(self.sections.values()),
                         layout=widgets.Layout(border="1px solid #ccc", padding="6px 12px", max_width="900px"))

    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus the card as static HTML for viewers that cannot run widgets."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/html"] = self.html
        return bundle

    @property
    def html(self) -> str:
        """All sections' HTML, in order (what a test or an export reads)."""
        return "\n".join(w.value for w in self.sections.values())
