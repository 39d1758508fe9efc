"""What a result is called and which experiment it holds: file-name slugs and the result's
path, the identity of a result, and the checks that never let one experiment's result replace
another's."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ciosl.data.types import DatasetSpec
from ciosl.evaluation.checkpoint import checkpoint_path
from ciosl.evaluation.protocol import Regime
from ciosl.fileio import dangling_text, load_json
from ciosl.learners.base import Learner, available_methods, parse_value

if TYPE_CHECKING:
    from ciosl.evaluation.validation import ExperimentSpec


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def exact_slug(name: str) -> str:
    """``name`` made file-name safe, injectively: a name the slug would change (``a/b``,
    ``a b``, ``a-b`` would all be ``a-b``) gets a hash of the exact name appended."""
    safe = _safe(name)
    return safe if safe == name and safe else f"{safe}-{_digest(name)}" if safe else _digest(name)


def setting_text(value: Any) -> str:
    """A setting's value as it appears in variant names (as ``grid`` writes TOML values)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


def _slug_text(value: Any) -> str:
    """``setting_text`` with a list's commas as dashes (the names results always had)."""
    if isinstance(value, tuple | list):
        return "-".join(str(v) for v in value)
    return setting_text(value)


def slug_items(items: Sequence[tuple[str, str]], sep: str = "-") -> str:
    """``[("lr", "0.1"), ("tag", "a b")]`` -> ``lr-0.1+tag-a-b-<hash>``: the items in this
    order, file-name safe; a hash of the exact items is appended when making them safe lost a
    character (so ``tag=a/b``, ``tag=a-b`` and ``tag=a b`` never share a name), and long ones
    are cut and end in a hash."""
    raw = [f"{n}{sep}{t}" for n, t in items]
    parts = [_safe(r) if sep == "-" else sep.join(_safe(x) for x in r.split(sep, 1))
             for r in raw]
    slug = "+".join(parts)
    lossy = any(p != r for p, r in zip(parts, raw, strict=True))
    exact = json.dumps([list(i) for i in items]) if lossy else slug
    if len(slug) > 80:
        slug = f"{slug[:60]}-{_digest(exact)}"
    elif lossy:
        slug = f"{slug}-{_digest(exact)}"
    return slug


def variant_slug(settings: dict[str, Any]) -> str:
    """``{"lr": 0.1, "selection": "lapn"}`` -> ``lr-0.1+selection-lapn`` (sorted, file-name
    safe and injective, see ``slug_items``): the variant part of a result file name, as sweeps
    name the cells of a ``[grid.METHOD]`` table."""
    return slug_items([(n, _slug_text(v)) for n, v in sorted(settings.items())])


def dataset_slug(dataset: str) -> str:
    """A dataset name for file names: ``features:PATH`` becomes ``features-<stem>-<hash of the
    absolute path>``, so two feature files with the same name never share a result file."""
    if not dataset.startswith("features:"):
        return exact_slug(dataset)
    path = Path(dataset.split(":", 1)[1]).expanduser()
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"features-{_safe(path.stem)}-{digest}"


MAX_STEM_BYTES = 200  # + ".ckpt" and a temporary's ".NAME.XXXXXXXX.tmp": within 255 bytes


def fit_name(stem: str) -> str:
    """``stem`` as a file name's stem that every file system here holds (255 bytes with the
    suffixes and temporaries added): a longer one (long variant names, setting values or file
    names) keeps its first bytes and gets a hash of the whole, so two never collide."""
    raw = stem.encode()
    if len(raw) <= MAX_STEM_BYTES:
        return stem
    head = raw[:MAX_STEM_BYTES - 13].decode("utf-8", errors="ignore")
    return f"{head}-{hashlib.sha256(raw).hexdigest()[:12]}"


def result_path(out_dir: str | Path, dataset: str, ordering: str, method: str,
                regime: str = "streaming", variant: str = "", extractor: str = "",
                protocol: str = "") -> Path:
    """``<dataset>[-<extractor>]_<ordering>_<method>[_<variant>][_<protocol>][_<regime>].json``
    (no regime suffix for streaming; ``variant``: ``variant_slug`` of the settings, empty for
    none; ``extractor``: empty for the dataset's default one, so that runs of one stream through
    two extractors never overwrite each other; ``protocol``: ``protocol_slug``, empty for the
    dataset's protocol)."""
    suffix = "" if regime == "streaming" else f"_{regime}"
    middle = f"_{variant}" if variant else ""
    middle += f"_{protocol}" if protocol else ""
    name = dataset_slug(dataset) + (f"-{_safe(extractor)}" if extractor else "")
    stem = f"{name}_{ordering}_{exact_slug(method)}{middle}{suffix}"
    return Path(out_dir) / f"{fit_name(stem)}.json"


def protocol_slug(exp: ExperimentSpec, spec: DatasetSpec) -> str:
    """The protocol options of ``exp`` that differ from the dataset's defaults, as
    ``limit_per_class=60+offline_epochs=3`` (``=``, never in a variant slug, keeps the two
    apart): ``--limit-per-class``, ``--offline-epochs``, ``--weights`` (a hash of the file's
    path), and the regime's ``--batch-size`` / ``--epochs`` where the regime uses them."""
    items: list[tuple[str, str]] = []
    if exp.limit_per_class is not None:
        items.append(("limit_per_class", str(exp.limit_per_class)))
    if exp.offline_epochs is not None and exp.offline_epochs != spec.offline_epochs:
        items.append(("offline_epochs", str(exp.offline_epochs)))
    default = Regime()
    if exp.regime in ("online", "batch") and exp.batch_size != default.batch_size:
        items.append(("batch_size", str(exp.batch_size)))
    if exp.regime == "batch" and exp.epochs != default.epochs:
        items.append(("epochs", str(exp.epochs)))
    if exp.max_events is not None:
        items.append(("max_events", str(exp.max_events)))
    if not exp.offline_reference:
        items.append(("offline", "none"))
    if exp.open_set:
        items.append(("open_set", "on"))
    if exp.weights is not None:
        weights = Path(exp.weights).expanduser()
        items.append(("weights", f"{_safe(weights.stem)}-{_digest(str(weights.resolve()))}"))
    return slug_items(items, sep="=")


def name_settings(exp: ExperimentSpec, cls: type[Learner], spec: DatasetSpec) -> dict[str, Any]:
    """The settings a result's name shows: the ``--set`` ones, typed, and ``--buffer`` when it
    is not the dataset's (named like ``--set buffer=N``, which it equals)."""
    known = {s.name: s for s in cls.settings()}
    typed = {n: parse_value(known[n], t) for n, t in exp.settings.items()}
    if exp.buffer is not None and "buffer" not in typed and exp.buffer != spec.buffer:
        typed["buffer"] = exp.buffer
    return typed


def experiment_path(exp: ExperimentSpec, cls: type[Learner]) -> Path:
    """The result JSON of ``exp`` (which has an output folder): named by its settings and
    protocol options too, so a variant never overwrites the default's result."""
    from ciosl.data.datasets import get_spec

    spec = get_spec(exp.dataset)
    extractor = exp.extractor or ""
    if extractor and extractor == spec.default_extractor:
        extractor = ""
    return result_path(exp.out_dir, exp.dataset, exp.ordering, cls.name, exp.regime,
                       variant_slug(name_settings(exp, cls, spec)), extractor,
                       protocol_slug(exp, spec))


IDENTITY = ("dataset", "ordering", "method", "method_source", "regime", "extractor",
            "limit_per_class", "settings", "protocol", "features_key")


def identity_of(result: dict) -> dict:
    """The fields of a result (or ``result_header``) that make it the experiment it is, as
    JSON reads them back: two results with different ones are different experiments. The
    seeds and the Omega_all definition are not among them (a rerun with more seeds extends an
    experiment; Omega_all is recomputed from the per-event accuracies); the regime's batch
    size and epochs count only where the regime uses them. Fields a result lacks are left out
    (a result of an older ciosl)."""
    out = {k: result[k] for k in IDENTITY if k in result}
    regime = result.get("regime")
    if "regime" in result:
        regime = regime if isinstance(regime, dict) else {"name": regime}
        name = regime.get("name") or "streaming"
        out["regime"] = {"name": name,
                         **({"batch_size": regime.get("batch_size")}
                            if name in ("online", "batch") else {}),
                         **({"epochs": regime.get("epochs")} if name == "batch" else {})}
    if isinstance(out.get("settings"), dict):
        out["settings"] = {k: v for k, v in out["settings"].items() if k != "seed"}
    return json.loads(json.dumps(out, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def differences(old: dict, new: dict) -> list[str]:
    """``field: OLD there, NEW here`` for each identity field (one level into tables) that
    ``old`` records and ``new`` has otherwise."""
    a, b = identity_of(old), identity_of(new)
    if isinstance(a.get("settings"), dict) and isinstance(b.get("settings"), dict):
        # a setting added after ``old`` was written: it ran at the method's recorded old value
        cls = available_methods().get(a.get("method")) if isinstance(a.get("method"),
                                                                      str) else None
        for k, v in getattr(cls, "added_settings", {}).items():
            if k in b["settings"] and k not in a["settings"]:
                a["settings"][k] = json.loads(json.dumps(v, default=str))
    out = []
    for key in IDENTITY:
        if key not in a or a[key] == b.get(key):
            continue
        x, y = a[key], b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{key}.{k}: {_short(x.get(k, '(absent)'))} there, "
                    f"{_short(y.get(k, '(absent)'))} here"
                    for k in sorted(set(x) | set(y), key=str) if x.get(k, ...) != y.get(k, ...)]
        else:
            out.append(f"{key}: {_short(x)} there, {_short(y)} here")
    return out


def check_overwrite(path: str | Path, new: dict, *, force: bool = False,
                    seeds: Sequence[int] | None = None, what: str = "--out") -> None:
    """Refuse to replace ``path`` unless it holds the same experiment as ``new`` (a result or
    ``result_header``; see ``identity_of``), whatever wrote it, or ``force``. With ``seeds``
    (``ciosl run``): also refuse to drop finished runs of the same experiment, seeds the file
    holds and the new result does not."""
    if force:
        return
    problem = overwrite_problem(path, new, seeds)
    if problem is None:
        return
    text, dropped = problem
    if dropped:
        raise ValueError(f"{text}: refused to drop them; give --seeds including them, or "
                         "--force replaces it")
    raise ValueError(f"{text}: refused to replace it; --force replaces it, or choose another "
                     f"{what}")


def overwrite_problem(path: str | Path, new: dict, seeds: Sequence[int] | None = None
                      ) -> tuple[str, bool] | None:
    """Why ``path`` may not be replaced by ``new`` (``check_overwrite``), and whether it is
    that finished runs would be dropped; None if it may."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    try:
        old = load_json(path, "result")
    except (OSError, ValueError) as e:
        return (str(e) if isinstance(e, ValueError) else message_of(e)), False
    if not isinstance(old, dict) or not all(isinstance(old.get(k), str)
                                            for k in ("dataset", "ordering", "method")):
        return f"{path} holds no ciosl result", False
    diff = differences(old, new)
    if diff:
        more = f"; and {len(diff) - 1} more" if len(diff) > 1 else ""
        return f"{path} holds another experiment ({diff[0]}{more})", False
    held = old.get("seeds")
    if seeds is not None and isinstance(held, list):
        lost = sorted({s for s in held if isinstance(s, int)} - {int(s) for s in seeds})
        if lost:
            shown = ",".join(map(str, lost[:10])) + ("..." if len(lost) > 10 else "")
            return (f"{path} holds finished runs of this experiment that this one does not "
                    f"repeat (seeds {shown})"), True
    return None


def message_of(e: OSError) -> str:
    return f"{e.filename}: {e.strerror}" if e.strerror and e.filename else str(e)


def check_names(path: Path) -> None:
    """A dangling symbolic link at the result's name ``path`` or its checkpoint's, refused
    before any work (with ``--force`` or ``--resume`` too): there is nothing to replace or
    resume there, and writing through it would create the target's folders."""
    for name, what in ((path, "result"), (checkpoint_path(path), "checkpoint")):
        if os.path.islink(name) and not os.path.exists(name):
            raise ValueError(f"{what} {dangling_text(name)}: refused before any work; remove "
                             "the link, or choose another --out")
