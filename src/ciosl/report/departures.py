"""Departures from the paper: the letter each set of a result's non-paper settings gets
(``Legend``, ``departure_legend``), the evidence in docs/findings/ for each, and the legend's
text under a table (``legend_parts``, ``legend_markdown``)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ciosl.report.results import Entry, method_key
from ciosl.report.text import md_escape

if TYPE_CHECKING:
    from ciosl.report.tables import Table


Departures = tuple[tuple[str, str], ...]  # sorted (setting, value text) pairs

# where docs/findings/ gives the evidence for each departure from the paper: (title, its file
# and section, relative to docs/findings.md's folder)
EVIDENCE = {
    "max_grad_norm": ("gradient clipping",
                      "findings/gradient-clipping.md#gradient-clipping-of-the-mlp-heads"),
    "lambda1": ("the KL's weight", "findings/kl-weight.md#the-kls-weight"),
    "lambda2": ("distillation", "findings/distillation.md#distillation"),
    "distill_when": ("distillation", "findings/distillation.md#distillation"),
    "selection": ("selection", "findings/selection-and-replacement.md#selection-and-replacement"),
    "prior_scale": ("the prior's scale", "findings/prior-scale.md#the-priors-scale"),
    "temperature": ("the temperature", "findings/temperature.md#the-temperature"),
}


def departures_of(e: Entry) -> Departures:
    return tuple(sorted((k, _value_text(_hashable(v))) for k, v in e.departures.items()))


@dataclass
class Legend:
    """A letter per distinct set of departures from the paper, in the order of ``sets``."""

    sets: list[Departures]

    def letter(self, d: Departures) -> str:
        from ciosl.report.text import mark_letter

        return mark_letter(self.sets.index(d)) if d in self.sets else ""

    def mark(self, entries: list[Entry | None]) -> str:
        """The letters of the entries' departures (several when a cell pools results)."""
        letters = {self.letter(departures_of(e)) for e in entries if e is not None}
        return ",".join(sorted(x for x in letters if x))

    def lines(self, marks: set[str]) -> list[tuple[str, str]]:
        """(letter, what it stands for) for the letters in ``marks``: a set that holds an
        earlier one is written as that letter plus the rest, so each departure is spelled out
        once."""
        used = {x for m in marks for x in m.split(",") if x}
        out = []
        for d in self.sets:
            letter = self.letter(d)
            if letter not in used:
                continue
            bases = [b for b in self.sets[:self.sets.index(d)]
                     if set(b) < set(d) and self.letter(b) in used]
            base = max(bases, key=len) if bases else ()
            rest = ", ".join(f"{k}={v}" for k, v in d if (k, v) not in base)
            out.append((letter, f"{self.letter(base)} + {rest}" if base else rest))
        return out


def departure_legend(entries: list[Entry]) -> Legend:
    """Letters for every set of departures among ``entries``: smaller sets first, then in
    table order (so a set that holds another comes after it)."""
    first: dict[Departures, tuple] = {}
    for e in sorted(entries, key=lambda e: (method_key(e.method), e.column)):
        d = departures_of(e)
        if d:
            first.setdefault(d, (len(d), len(first)))
    return Legend(sorted(first, key=first.__getitem__))


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _value_text(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)


FINDINGS = "docs/findings.md"


def legend_parts(table: Table) -> tuple[str, list[tuple[str, str]]]:
    """The legend's text (each letter and the departures it stands for) and the evidence:
    (section title, its file and anchor relative to docs/findings.md's folder) per setting it
    names."""
    if not table.legend:
        return "", []
    text = "; ".join(f"{letter}: {what}" for letter, what in table.legend)
    sections = list(dict.fromkeys(EVIDENCE[k] for k in table.evidence))
    return f"Not the paper's setting: {text}.", sections


def evidence_href(findings: str, target: str) -> str:
    """The link to ``target`` (an ``EVIDENCE`` file and anchor) from where ``findings`` (the
    relative path of docs/findings.md) is relative to."""
    return posixpath.join(posixpath.dirname(findings), target)


def legend_markdown(table: Table, findings: str | None) -> str:
    """The legend as one Markdown line; its evidence linked when ``findings`` (the relative
    path of docs/findings.md) is known, named otherwise."""
    text, sections = legend_parts(table)
    if not text:
        return ""
    if findings is None:
        where = ", ".join(title for title, _ in sections)
        return f"{md_escape(text)} Evidence: {FINDINGS}" + (f" ({where})." if where else ".")
    links = ", ".join(f"[{title}]({evidence_href(findings, target)})"
                      for title, target in sections)
    return f"{md_escape(text)} Evidence: [{FINDINGS}]({findings})" + (
        f" ({links})." if links else ".")
