"""Small HTML helpers shared by the widgets: escaping, safe links, and the measured/derived labels."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlparse

# Every figure on screen carries one of these kinds: taken from arrays or timings, from a content formula, or neither.
KINDS = {
    "measured": ("#1b5e20", "#e8f5e9"),
    "derived": ("#0d47a1", "#e3f2fd"),
    "illustrative": ("#6d4c41", "#efebe9"),
}


def esc(value: object) -> str:
    """Text from YAML or from the learner, made safe to place inside HTML."""
    return html.escape(str(value), quote=True)


def safe_url(url: object) -> str | None:
    """The URL if it is an absolute http(s) link, else None (it is then shown as text, never as href)."""
    text = str(url).strip()
    parsed = urlparse(text)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return text
    return None


def link(title: object, url: object) -> str:
    """An escaped link, or escaped plain text when the URL is not http(s)."""
    href = safe_url(url)
    if href is None:
        return f"{esc(title)} <span style='color:#888'>({esc(url)})</span>"
    return f"<a href='{esc(href)}' target='_blank' rel='noopener noreferrer'>{esc(title)}</a>"


def badge(kind: str, detail: str = "") -> str:
    """A coloured label saying whether a figure is measured, derived or illustrative."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    fg, bg = KINDS[kind]
    text = esc(kind if not detail else f"{kind}: {detail}")
    # a whole label moves to the next line when it does not fit; only one wider than its column breaks
    return (f"<span style='color:{fg};background:{bg};border-radius:3px;padding:0 4px;"
            f"font-size:85%;line-height:1.35;display:inline-block'>{text}</span>")


def error_box(message: str) -> str:
    return (f"<div style='color:#b71c1c;background:#ffebee;border-left:4px solid #b71c1c;padding:4px 8px'>"
            f"{esc(message)}</div>")


def note_box(message_html: str) -> str:
    """An amber note; `message_html` must already be escaped."""
    return (f"<div style='background:#fff8e1;border-left:4px solid #ff8f00;padding:4px 8px'>"
            f"{message_html}</div>")


def substitute(expression: str, params: dict[str, Any]) -> str:
    """`L * 2 * T` with L=12, T=512 -> `12 × 2 × 512`: the formula as the learner reads it, numbers in."""
    def value(match: re.Match) -> str:
        name = match.group(0)
        return f"{params[name]:,}" if name in params else name
    return re.sub(r"[A-Za-z_][A-Za-z_0-9]*", value, expression).replace("*", "×")


def formula_block(item: Any, params: dict[str, Any], value_bytes: int, formatted: str) -> str:
    """A science item as LaTeX, then its expression with the numbers in and the bytes it gives (derived)."""
    return (f"<b>{esc(item.title)}</b> {badge('derived', 'content formula')}"
            f"<div>$${esc(item.equation)}$$</div>"
            f"<div style='font-family:monospace'>= {esc(substitute(item.compute, params))} "
            f"= {value_bytes:,} B = {esc(formatted)}</div>")


def readout_table(rows: list[tuple[str, str, str]]) -> str:
    """Rows of (label, value, badge HTML) as a table; labels and values are escaped here, badges are not."""
    value_style = "text-align:right;font-family:monospace;white-space:nowrap"
    body = "".join(f"<tr><td style='min-width:220px'>{esc(a)}</td><td style='{value_style}'>{esc(b)}</td>"
                   f"<td>{c}</td></tr>" for a, b, c in rows)
    return f"<table>{body}</table>"
