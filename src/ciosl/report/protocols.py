"""Results of different evaluation protocols never share a column.

A result's numbers depend on the protocol it ran, not only on its method and settings: the
offline reference (``--offline-epochs``: its epochs, batch size, learning rate), the base
fraction and the classes per step, and in the online and batch regimes their batch size and
epochs. ``Column`` (dataset, ordering, ``--limit-per-class``, extractor) does not say all of
that, so two results that differ only there would otherwise share a column: a table would
compare lr 0.01 at 2 offline epochs with lr 0.05 at 1 and bold one of them.

``separate_protocols`` gives each entry's column the protocol it ran (its key) and, in its
label, the protocol values that tell it apart from the other columns of the same dataset and
ordering, or that depart from the dataset's defaults: ``digits ≤20/class (offline_epochs=2)``.
``protocol_notes`` says, for the report's introduction, which columns are kept apart.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from functools import cache
from typing import Any

from ciosl.report.results import Column, Entry
from ciosl.report.text import shorten

NOT_RECORDED = "not recorded"  # a result of an older ciosl, without a protocol field


def protocol_items(data: dict) -> dict[str, Any]:
    """The protocol a result ran, flat: ``base_fraction``, ``classes_per_step``,
    ``offline_epochs``, ``offline_batch_size``, ``offline_lr``, ... ({} if not recorded)."""
    protocol = data.get("protocol")
    if not isinstance(protocol, dict):
        return {}
    out = {}
    for key, value in protocol.items():
        if isinstance(value, dict):
            out.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            out[str(key)] = value
    return out


def regime_items(data: dict) -> dict[str, Any]:
    """The regime's batch size and epochs where the regime uses them and they are not the
    defaults (``regime_batch_size=32``): streaming results have none."""
    from ciosl.evaluation.protocol import Regime

    regime = data.get("regime")
    if not isinstance(regime, dict):
        return {}
    name, default = regime.get("name"), Regime()
    used = ("batch_size",) if name == "online" else ("batch_size", "epochs") \
        if name == "batch" else ()
    return {f"regime_{k}": regime.get(k) for k in used
            if regime.get(k) != getattr(default, k)}


@cache
def _defaults(dataset: str) -> str | None:
    """The dataset's protocol as ``protocol_items`` gives it (JSON text, cached), or None
    when the dataset is not known here."""
    try:
        from ciosl.data.datasets import get_spec
        from ciosl.evaluation.protocol import OfflineSettings

        spec = get_spec(dataset)
        offline = OfflineSettings(epochs=spec.offline_epochs,
                                  batch_size=spec.offline_batch_size).__dict__
    except Exception:  # an unknown dataset, a features file that is gone: no defaults
        return None
    return json.dumps(protocol_items({"protocol": {
        "base_fraction": spec.base_fraction, "classes_per_step": spec.classes_per_step,
        "offline": offline}}))


def _text(value: Any) -> str:
    return shorten(json.dumps(value, default=str) if not isinstance(value, str) else value, 30)


def separate_protocols(entries: list[Entry]) -> None:
    """Give each entry's column its protocol: the key that keeps different protocols apart,
    and the label that says how they differ."""
    groups: dict[Column, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.column].append(e)
    for column, group in groups.items():
        items = [protocol_items(e.data) for e in group]
        recorded = [it for it in items if it]
        varying = {k for k in {k for it in recorded for k in it}
                   if len({json.dumps(it.get(k, NOT_RECORDED), default=str)
                           for it in recorded}) > 1}
        mixed = bool(recorded) and len(recorded) < len(items)  # some from an older ciosl
        default_text = _defaults(column.dataset)
        default = json.loads(default_text) if default_text is not None else None
        for e, it in zip(group, items, strict=True):
            shown = {k: it.get(k, NOT_RECORDED) for k in varying}
            if default is not None:
                # a departure from the dataset's protocol, or an option it has not (max_events)
                shown.update({k: v for k, v in it.items() if default.get(k, ...) != v})
            if mixed and not it:
                shown = {"protocol": NOT_RECORDED}
            regime = regime_items(e.data)
            key = json.dumps([it, regime], sort_keys=True, default=str)
            text = ", ".join(f"{k}={_text(v)}" for k, v in sorted({**shown, **regime}.items()))
            e.column = replace(column, protocol=key,
                               label=column.label + (f" ({text})" if text else ""))


def protocol_notes(entries: list[Entry]) -> list[str]:
    """One line per dataset and ordering whose results ran more than one protocol: the
    columns they are kept apart in (never compared with each other)."""
    groups: dict[tuple, set[Column]] = defaultdict(set)
    for e in entries:
        c = e.column
        groups[(c.ordering_rank, c.dataset_rank, c.ordering, c.dataset, c.limit,
                c.extractor)].add(c)
    lines = []
    for columns in groups.values():
        if len({c.protocol for c in columns}) > 1:
            ordered = sorted(columns)
            lines.append(f"{ordered[0].title.split(' · ')[0]} · {shorten(ordered[0].dataset, 40)}"
                         f": results of {len(ordered)} protocols, kept in separate columns and "
                         f"never compared: {'; '.join(c.label for c in ordered)}.")
    return lines
