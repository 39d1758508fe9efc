"""A self-contained HTML report: tables, embedded PNG figures, and the exact settings, grids and
versions behind every number."""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path

from ciosl.report.plots import Figure
from ciosl.report.results import Entry, method_name, settings_text
from ciosl.report.tables import Table

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 0.3em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.best { font-weight: bold; background: #eef6ee; }
p.note { font-size: 0.8em; color: #555; margin: 0.1em 0; }
figure { display: inline-block; margin: 0.5em 1em 1em 0; vertical-align: top; }
figure img { max-width: 580px; border: 1px solid #ddd; }
figcaption { font-size: 0.8em; color: #555; max-width: 580px; }
pre { background: #f7f7f7; padding: 0.6em; font-size: 0.8em; overflow-x: auto; }
details { margin: 0.2em 0; }
"""


def table_html(table: Table) -> str:
    out = [f'<table class="results" data-kind="{escape(table.kind)}">', "<thead>"]
    stub = len(table.stub)
    if any(g for g, _ in table.columns):
        groups: list[list] = []
        for g, _ in table.columns:
            if groups and groups[-1][0] == g:
                groups[-1][1] += 1
            else:
                groups.append([g, 1])
        out.append("<tr>" + "".join(f'<th rowspan="2">{escape(h)}</th>' for h in table.stub)
                   + "".join(f'<th colspan="{n}">{escape(g)}</th>' for g, n in groups) + "</tr>")
        out.append("<tr>" + "".join(f"<th>{escape(lab)}</th>" for _, lab in table.columns)
                   + "</tr>")
    else:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in table.header()) + "</tr>")
    out.append("</thead><tbody>")
    for i, row in enumerate(table.rows):
        cells = [f"<th>{escape(c)}</th>" if k == 0 else f"<td>{escape(c)}</td>"
                 for k, c in enumerate(row[:stub])]
        for j, c in enumerate(row[stub:]):
            cls = "num best" if (i, j) in table.bold else "num"
            cells.append(f'<td class="{cls}">{escape(c)}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    out += [f'<p class="note">{escape(n)}</p>' for n in table.notes]
    return "\n".join(out)


def figure_html(fig: Figure) -> str:
    data = base64.b64encode(fig.png or Path(fig.path).read_bytes()).decode()
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(fig.title)}">'
            f"<figcaption><b>{escape(fig.title)}.</b> {escape(fig.caption)}</figcaption></figure>")


def provenance_html(entries: list[Entry], root: Path) -> str:
    out = ["<table class=\"provenance\"><thead><tr><th>result</th><th>method</th><th>dataset"
           "</th><th>ordering</th><th>regime</th><th>runs</th><th>non-default settings</th>"
           "<th>versions</th></tr></thead><tbody>"]
    for e in entries:
        try:
            name = str(e.path.relative_to(root))
        except ValueError:
            name = str(e.path)
        versions = ", ".join(f"{k} {v}" for k, v in (e.data.get("versions") or {}).items())
        diff = settings_text(e.non_default) or "(defaults)"
        exact = {k: e.data.get(k) for k in ("settings", "protocol", "seeds", "extractor",
                                             "features_key", "feature_dim", "n_train", "n_test",
                                             "limit_per_class", "sweep") if k in e.data}
        out.append(
            f"<tr><td><details><summary>{escape(name)}</summary><pre>"
            f"{escape(json.dumps(exact, indent=1))}</pre></details></td>"
            f"<td>{escape(method_name(e.method))}</td><td>{escape(e.column.label)}</td>"
            f"<td>{escape(e.column.ordering)}</td><td>{escape(e.regime)}</td>"
            f"<td>{e.n_runs}</td><td>{escape(diff)}</td><td>{escape(versions)}</td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def render_html(title: str, tables: list[Table], figures: list[Figure], entries: list[Entry],
                root: Path, grids: list[tuple[str, str]], intro: list[str] = ()) -> str:
    body = [f"<h1>{escape(title)}</h1>",
            f"<p>{len(entries)} results from <code>{escape(str(root))}</code>.</p>"]
    body += [f'<p class="note">{escape(line)}</p>' for line in intro]
    for table in tables:
        body += [f"<h2>{escape(table.title)}</h2>", table_html(table)]
    if figures:
        body.append("<h2>Figures</h2>")
        body += [figure_html(f) for f in figures]
    body.append("<h2>Provenance: the exact settings and versions of every result</h2>")
    body.append(provenance_html(entries, root))
    for name, text in grids:
        body += [f"<h3>Grid <code>{escape(name)}</code></h3>", f"<pre>{escape(text)}</pre>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
