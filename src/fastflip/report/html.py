"""The report's HTML: one static, self-contained page (relative links only, no JavaScript).

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

Examples
--------
>>> print(table([{"bit": 30, "rate": 0.5}], [("bit", "bit", None), ("rate", "rate", "{:.3f}")]))
<table><thead><tr><th>bit</th><th>rate</th></tr></thead><tbody>
<tr><td>30</td><td>0.500</td></tr>
</tbody></table>
>>> fmt(None), fmt(float("nan"), "{:.2f}"), fmt(3, "{:,}")
('–', 'NaN', '3')
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["esc", "fmt", "table", "key_values", "Markup", "figure", "page"]

#: A column: (key in the row, header text, format string or None for str()).
Column = tuple[str, str, "str | None"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
table.kv td { text-align: left; } table.kv td:first-child { font-weight: 600; background: #fafafa; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
code, pre { font-size: 0.85em; } pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
.muted { color: #666; font-size: 0.9em; }
"""


def esc(value: Any) -> str:
    """HTML-escaped ``str(value)``."""
    return html.escape(str(value), quote=True)


def fmt(value: Any, spec: str | None = None) -> str:
    """A cell's text: ``–`` for None, ``NaN`` for NaN, else ``spec.format(value)`` (or ``str``)."""
    if value is None or value == "":
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if spec is None:
        return str(value)
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], cls: str | None = None) -> str:
    """An HTML table of ``rows`` with the given columns."""
    head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in columns)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{esc(fmt(r.get(k), spec))}</td>" for k, _, spec in columns) + "</tr>" for r in rows
    )
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def key_values(items: Sequence[tuple[str, Any]]) -> str:
    """A two-column table of labels and (already escaped when ``Markup``) values."""
    rows = []
    for k, v in items:
        text = v.html if isinstance(v, Markup) else esc(fmt(v))
        rows.append(f"<tr><td>{esc(k)}</td><td>{text}</td></tr>")
    return '<table class="kv"><tbody>\n' + "\n".join(rows) + "\n</tbody></table>"


class Markup:
    """HTML that :func:`key_values` inserts as is."""

    def __init__(self, html_text: str) -> None:
        self.html = html_text


def figure(src: str, alt: str, caption: str, links: Sequence[str] = ()) -> str:
    """An ``<img>`` of a PNG beside the page, with a caption and links to its CSV tables."""
    more = "".join(f' <a href="{esc(h)}">{esc(h)}</a>' for h in links)
    data = f" Data:{more}" if links else ""
    return (f'<figure><a href="{esc(src)}"><img src="{esc(src)}" alt="{esc(alt)}"></a>'
            f"<figcaption>{esc(caption)}{data}</figcaption></figure>")


def page(title: str, sections: Sequence[tuple[str | None, str]], subtitle: str = "") -> str:
    """The whole page: a title, then ``(heading, html)`` sections."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    if subtitle:
        parts.append(f'<p class="muted">{esc(subtitle)}</p>')
    for heading, body in sections:
        if heading:
            parts.append(f"<h2>{esc(heading)}</h2>")
        parts.append(body)
    parts.append("</body></html>\n")
    return "\n".join(parts)
