"""Names from result files made safe for each output: Markdown, the terminal, matplotlib, file
names. A result JSON is user data: its method, dataset or setting names may hold markup, escape
sequences, mathtext or 20,000 characters, and none of that may reach an output as such."""

from __future__ import annotations

import hashlib
import re

from ciosl.errors import printable  # noqa: F401 (moved below the layers; public here too)

LABEL_MAX = 60  # the longest row label, legend entry or plot label the report prints
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>&|$!#~])")


def shorten(text: str, width: int = LABEL_MAX) -> str:
    """``text`` cut to ``width`` characters, the cut marked with an ellipsis."""
    text = str(text)
    return text if len(text) <= width else text[:width - 1] + "…"


def shorten_middle(text: str, width: int = LABEL_MAX) -> str:
    """``text`` cut to ``width`` characters in its middle, keeping its start and its end (a file
    name's variant and extension), the cut marked with an ellipsis."""
    text = str(text)
    if len(text) <= width:
        return text
    head = (width - 1) // 3
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def md_escape(text: str) -> str:
    """Plain text for a Markdown table cell or paragraph: markup characters (HTML tags, links,
    emphasis, code, math, table pipes) backslash-escaped, non-printable characters escaped."""
    return _MD_SPECIAL.sub(r"\\\1", printable(text))


def mpl_escape(text: str, width: int = LABEL_MAX) -> str:
    """Text for a matplotlib label: shortened, and ``$`` escaped so no mathtext is parsed."""
    return shorten(printable(text), width).replace("$", r"\$")


def file_slug(text: str, width: int = 80) -> str:
    """A file-name fragment of ``text``: runs of other characters than ``A-Za-z0-9_.-`` become
    ``-``; a long one is cut and given a hash of the whole text, so it stays distinct."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-.") or "x"
    if len(slug) <= width:
        return slug
    return slug[:width - 9] + "-" + hashlib.sha1(str(text).encode()).hexdigest()[:8]


_SUPERSCRIPT = dict(zip("abcdefghijklmnoprstuvwxyz", "ᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖʳˢᵗᵘᵛʷˣʸᶻ", strict=True))


def mark_letter(k: int) -> str:
    """The k-th footnote letter (a, b, ..., z, then aa, ab, ...; no q: it has no superscript)."""
    letters = "abcdefghijklmnoprstuvwxyz"
    return letters[k] if k < len(letters) else mark_letter(k // len(letters) - 1) + letters[
        k % len(letters)]


def superscript(letters: str) -> str:
    """``abc`` as Unicode superscript letters (Markdown and the terminal have no <sup>)."""
    return "".join(_SUPERSCRIPT.get(c, c) for c in letters)
