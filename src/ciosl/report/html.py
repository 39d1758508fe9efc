"""A self-contained HTML report: tables, embedded PNG figures, and the exact settings, grids and
versions behind every number."""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path

from ciosl.report.departures import evidence_href
from ciosl.report.plots import Figure
from ciosl.report.results import Entry, method_name, settings_text
from ciosl.report.tables import FINDINGS, Table, legend_parts
from ciosl.report.text import file_slug, printable, shorten, shorten_middle

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em;
       color: #222; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5em 0 0.3em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; }
th { background: #f2f2f2; }
tbody th { text-align: left; font-weight: normal; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.best { font-weight: bold; background: #eef6ee; }
table.wide td.num .sd { display: block; font-size: 0.85em; color: #666; }
sup { font-size: 0.75em; color: #a33; }
p.note { font-size: 0.8em; color: #555; margin: 0.1em 0; }
p.links { font-size: 0.8em; margin: 0.3em 0 0.8em; }
nav ol { font-size: 0.9em; columns: 2; }
figure { display: inline-block; margin: 0.5em 1em 1em 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figure.single img { max-width: 900px; }
figcaption { font-size: 0.8em; color: #555; max-width: 900px; }
pre { background: #f7f7f7; padding: 0.6em; font-size: 0.8em; overflow-x: auto; }
details { margin: 0.2em 0; }
"""
WIDE = 8  # value columns from which a table prints each std under its mean


def _text(value) -> str:
    """HTML text of a value that may come from a result file: printable and escaped."""
    return escape(printable(value))


def anchor(key: str) -> str:
    """An id for a table (``Table.key``) or a figure (``fig-`` + its file name)."""
    return "t-" + file_slug(key, 60)


def _num(text: str, wide: bool, sup: str = "") -> str:
    """A value cell's content with its departure letters (``sup``): in a wide table the ± std
    goes under the mean."""
    if wide and " ± " in text:
        mean, sd = text.split(" ± ", 1)
        return f'{_text(mean)}{sup}<span class="sd"> ± {_text(sd)}</span>'
    return _text(text) + sup


def table_html(table: Table, findings: str | None = None) -> str:
    wide = len(table.columns) >= WIDE
    kind = f"results{' wide' if wide else ''}"
    out = ['<div class="scroll">',
           f'<table class="{kind}" data-kind="{_text(table.kind)}">', "<thead>"]
    stub = len(table.stub)
    if any(g for g, _ in table.columns):
        groups: list[list] = []
        for g, _ in table.columns:
            if groups and groups[-1][0] == g:
                groups[-1][1] += 1
            else:
                groups.append([g, 1])
        out.append("<tr>" + "".join(f'<th rowspan="2">{_text(h)}</th>' for h in table.stub)
                   + "".join(f'<th colspan="{n}">{_text(g)}</th>' for g, n in groups) + "</tr>")
        out.append("<tr>" + "".join(f"<th>{_text(lab)}</th>" for _, lab in table.columns)
                   + "</tr>")
    else:
        out.append("<tr>" + "".join(f"<th>{_text(h)}</th>" for h in table.header()) + "</tr>")
    out.append("</thead><tbody>")
    def sup(i: int, j: int) -> str:
        mark = table.marks.get((i, j))
        return f"<sup>{_text(mark)}</sup>" if mark else ""

    for i, row in enumerate(table.rows):
        cells = [f"<th>{_text(c)}{sup(i, -1)}</th>" if k == 0 else f"<td>{_text(c)}</td>"
                 for k, c in enumerate(row[:stub])]
        for j, c in enumerate(row[stub:]):
            cls = "num best" if (i, j) in table.bold else "num"
            cells.append(f'<td class="{cls}">{_num(c, wide, sup(i, j))}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    out += [f'<p class="note">{_text(n)}</p>' for n in table.notes]
    text, sections = legend_parts(table)
    if text:
        if findings is None:
            where = ", ".join(title for title, _ in sections)
            evidence = f" Evidence: {FINDINGS}" + (f" ({_text(where)})." if where else ".")
        else:
            links = ", ".join(f'<a href="{escape(evidence_href(findings, a))}">{_text(t)}</a>'
                              for t, a in sections)
            evidence = (f' Evidence: <a href="{escape(findings)}">{FINDINGS}</a>'
                        + (f" ({links})." if links else "."))
        out.append(f'<p class="note">{_text(text)}{evidence}</p>')
    return "\n".join(out)


def figure_html(fig: Figure, fig_id: str = "", table: Table | None = None) -> str:
    data = base64.b64encode(fig.png or Path(fig.path).read_bytes()).decode()
    back = (f' Table: <a href="#{anchor(table.key)}">{_text(table.title)}</a>.'
            if table is not None else "")
    return (f'<figure class="single" id="{fig_id}"><img src="data:image/png;base64,{data}" '
            f'alt="{_text(fig.title)}"><figcaption><b>{_text(fig.title)}.</b> '
            f"{_text(fig.caption)}{back}</figcaption></figure>")


def provenance_html(entries: list[Entry], root: Path) -> str:
    out = ["<div class=\"scroll\"><table class=\"provenance\"><thead><tr><th>result</th>"
           "<th>method</th><th>dataset</th><th>ordering</th><th>regime</th><th>runs</th>"
           "<th>non-default settings</th><th>versions</th></tr></thead><tbody>"]
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
            f"<tr><td><details><summary title=\"{_text(name)}\">"
            f"{_text(shorten_middle(name))}</summary><pre>"
            f"{_text(json.dumps(exact, indent=1))}</pre></details></td>"
            f"<td>{_text(method_name(e.method))}</td><td>{_text(e.column.label)}</td>"
            f"<td>{_text(e.column.ordering)}</td><td>{_text(e.regime)}</td>"
            f"<td>{e.n_runs}</td><td>{_text(shorten(diff, 200))}</td>"
            f"<td>{_text(versions)}</td></tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def render_html(title: str, tables: list[Table], figures: list[Figure], entries: list[Entry],
                root: Path, grids: list[tuple[str, str]], intro: list[str] = (),
                findings: str | None = None, count: int | None = None) -> str:
    """The page: a contents list, each table with links to its figures, the figures with a
    link back to their table, then the provenance of every result."""
    fig_ids = [f"fig-{k}-{file_slug(Path(f.path).stem, 60)}" for k, f in enumerate(figures)]
    by_key = {t.key: t for t in tables}
    contents = [f'<li><a href="#{anchor(t.key)}">{_text(t.title)}</a></li>' for t in tables]
    if figures:
        contents.append('<li><a href="#figures">Figures</a></li>')
    contents.append('<li><a href="#provenance">Provenance</a></li>')
    body = [f"<h1>{_text(title)}</h1>",
            f"<p>{len(entries) if count is None else count} results from "
            f"<code>{_text(root)}</code>.</p>"]
    body += [f'<p class="note">{_text(line)}</p>' for line in intro]
    body.append(f'<nav><h2>Contents</h2><ol>{"".join(contents)}</ol></nav>')
    for table in tables:
        body += [f'<h2 id="{anchor(table.key)}">{_text(table.title)}</h2>',
                 table_html(table, findings)]
        mine = [(fid, f) for fid, f in zip(fig_ids, figures, strict=True)
                if f.table == table.key]
        if mine:
            body.append('<p class="links">Figure' + ("s" if len(mine) > 1 else "") + ": "
                        + ", ".join(f'<a href="#{fid}">{_text(f.title)}</a>' for fid, f in mine)
                        + "</p>")
    if figures:
        body.append('<h2 id="figures">Figures</h2>')
        body += [figure_html(f, fid, by_key.get(f.table))
                 for fid, f in zip(fig_ids, figures, strict=True)]
    body.append('<h2 id="provenance">Provenance: the exact settings and versions of every '
                "result</h2>")
    body.append(provenance_html(entries, root))
    for name, text in grids:
        body += [f"<h3>Grid <code>{_text(name)}</code></h3>", f"<pre>{escape(text)}</pre>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="generator" content="ciosl report">'
            f"<title>{_text(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
