"""Experiment grids: a TOML file naming datasets, orderings, methods, setting variants and runs.

A grid expands into cells (dataset, ordering, method, setting variant, regime); every cell is one
``ciosl run`` experiment. The whole grid is checked before anything runs: an unknown key, method,
setting, ordering or a value of the wrong type is refused with the offending key named, and every
cell goes through ``experiment.validate`` (the same check ``ciosl run`` makes).

The format, every key in one example: docs/design.md, "Module notes".

``regimes = ["batch", "online", "streaming"]`` (with optional ``batch_size`` and ``epochs``)
makes one cell per regime when the installed ``ExperimentSpec`` knows regimes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ciosl.errors import echo, shown
from ciosl.evaluation.experiment import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_LIMIT_PER_CLASS,
    MAX_RUNS,
    MAX_SEED,
    ExperimentSpec,
    result_path,
    slug_items,
    validate,
)
from ciosl.evaluation.metrics import OMEGA_EVENTS, check_omega_events
from ciosl.fileio import MAX_TEXT_BYTES, read_text
from ciosl.learners.base import MAX_INT_DIGITS, Setting, get_method

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REGIMES = ("streaming", "online", "batch")
DEFAULT_VARIANT = "default"
KEYS = {
    "name": "the grid's name (default: the file name)",
    "description": "free text",
    "out": "output folder (default: results/<name>)",
    "cache": "cache folder for features and offline references",
    "data": "dataset folder",
    "datasets": "list of dataset names, or a table dataset -> list of orderings",
    "orderings": "orderings of every dataset (with a list of datasets)",
    "methods": "list of method names",
    "runs": "number of runs (seeds 0..runs-1)",
    "seeds": "explicit list of seeds",
    "limit_per_class": "keep at most N training samples per class",
    "extractor": "feature extractor",
    "weights": "MobileNetV2 weights file",
    "offline_epochs": "epochs of the offline reference learner",
    "settings": "[settings.METHOD] fixed settings",
    "grid": "[grid.METHOD] lists of values, one variant per combination",
    "variants": "[variants.METHOD.NAME] named setting variants",
    "regimes": "list of streaming, online, batch",
    "batch_size": "mini-batch size of the batch/online regimes",
    "epochs": "epochs of the batch regime",
    "omega_events": "Omega_all over the testing events after base init (after_base, the "
                    "default) or every event (all)",
}
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+=-]*$")
# a grid's name names its output folder (results/<name>) and its copy (sweep-<name>.toml): one
# plain folder name, never "", ".", ".." or a path
_GRID_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,99}$")
MAX_CELLS = 10_000  # cells of one grid (each is validated, listed and run)
MAX_GRID_RUNS = 1_000_000  # cells x seeds
# upper bounds of the numeric keys (the lower bound is 1)
BOUNDS = {"limit_per_class": MAX_LIMIT_PER_CLASS, "offline_epochs": MAX_EPOCHS,
          "batch_size": MAX_BATCH_SIZE, "epochs": MAX_EPOCHS}


Variant = tuple[dict[str, str], dict[str, str], str]  # settings, setting -> key, origin key


class GridError(ValueError):
    """A grid that cannot run; the message starts with the file and the offending key."""


@dataclass(frozen=True)
class Cell:
    """One experiment of a grid: ``ciosl run`` with these arguments."""

    id: str  # file-name safe, unique: dataset_ordering_method[_variant][_online|_batch]
    dataset: str
    ordering: str
    method: str
    variant: str  # "default" or the variant's name
    settings: dict[str, str]  # --set NAME=VALUE strings
    regime: str | None  # None: the grid names no regimes
    origin: str  # the grid key that defined the variant (for error messages)
    setting_keys: dict[str, str] = field(default_factory=dict)  # setting -> its grid key


@dataclass
class Grid:
    name: str
    source: str  # the file, for messages
    text: str  # the TOML as written (kept with the results)
    cells: list[Cell]
    seeds: list[int]
    out: Path
    cache: str | None = None
    data: str | None = None
    extractor: str | None = None
    weights: str | None = None
    limit_per_class: int | None = None
    offline_epochs: int | None = None
    regime_options: dict[str, int] = field(default_factory=dict)  # batch_size, epochs
    description: str = ""
    omega_events: str = "after_base"  # see metrics.omega_all
    device: str | None = None  # ciosl sweep --device / --backend / --threads (extraction;
    backend: str | None = None  # the device also trains the offline reference)
    threads: int | None = None

    def experiment(self, cell: Cell) -> ExperimentSpec:
        """The ``ExperimentSpec`` of ``cell`` (no output folder: the sweep writes the files)."""
        extra: dict[str, Any] = {}
        if cell.regime is not None:
            extra = {"regime": cell.regime, **self.regime_options}
        return ExperimentSpec(
            dataset=cell.dataset, ordering=cell.ordering, method=cell.method,
            seeds=list(self.seeds), extractor=self.extractor, weights=self.weights,
            settings=dict(cell.settings), limit_per_class=self.limit_per_class,
            offline_epochs=self.offline_epochs, cache_dir=self.cache, data_root=self.data,
            omega_events=self.omega_events, device=self.device, backend=self.backend,
            extract_threads=self.threads, **extra)


def spec_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(ExperimentSpec)}


def load_grid(path: str | Path, *, out: str | Path | None = None,
              seeds: list[int] | None = None, omega_events: str | None = None,
              device: str | None = None, backend: str | None = None,
              threads: int | None = None) -> Grid:
    """Read, expand and validate a grid file; ``out`` overrides the grid's output folder,
    ``seeds`` its runs (``ciosl sweep --runs 3``: the first seeds of a 10-run grid, whose run
    files a later full sweep reuses) and ``omega_events`` its Omega_all definition;
    ``device`` / ``backend`` / ``threads``: where its features are extracted (``ciosl
    features``' flags; None: $CIOSL_DEVICE / $CIOSL_BACKEND, else auto)."""
    path = Path(path)
    try:
        text = read_text(path, "grid", MAX_TEXT_BYTES)
    except OSError as e:
        raise GridError(f"{path}: cannot read the grid ({e.strerror or e})") from None
    except ValueError as e:  # not a regular file, too large, not UTF-8: the message names it
        raise GridError(str(e)) from None
    if text.startswith("\ufeff"):  # a byte-order mark, as some editors write: not TOML's
        text = text[1:]
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{path}: not valid TOML: {e}") from None
    except ValueError as e:  # Python's int() refuses more than 4300 digits
        why = ("it holds an integer of more digits than Python reads (no setting takes one)"
               if "digits" in str(e) else f"not valid TOML: {shown(e)}")
        raise GridError(f"{path}: {why}") from None
    grid = parse_grid(raw, source=str(path), text=text, out=out, default_name=path.stem)
    if seeds is not None:
        if (not seeds or any(s < 0 or s > MAX_SEED for s in seeds)
                or len(set(seeds)) != len(seeds) or len(seeds) > MAX_RUNS):
            raise GridError(f"seeds: expects at most {MAX_RUNS} distinct integers from 0 to "
                            f"{MAX_SEED}, got {echo(seeds)}")
        if len(seeds) * len(grid.cells) > MAX_GRID_RUNS:
            raise GridError(f"seeds: {len(grid.cells)} cells x {len(seeds)} runs is more than "
                            f"the {MAX_GRID_RUNS} runs a sweep accepts")
        grid.seeds = list(seeds)
    if omega_events is not None:
        grid.omega_events = check_omega_events(omega_events)
    from ciosl.data.features import execution

    execution(device, backend, threads)  # --device, --backend, --threads: one line each
    grid.device, grid.backend, grid.threads = device, backend, threads
    return grid


def parse_grid(raw: dict[str, Any], *, source: str = "<grid>", text: str = "",
               out: str | Path | None = None, default_name: str = "grid") -> Grid:
    return _Parser(raw, source).parse(text=text, out=out, default_name=default_name)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)


class _Parser:
    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def fail(self, key: str, message: str) -> GridError:
        return GridError(f"{self.source}: {key}: {message}")

    # ----------------------------------------------------------------- typed getters

    def get(self, key: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
        if key not in self.raw:
            return default
        value = self.raw[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise self.fail(key, f"expects {what}, got {_type_name(value)} {echo(value)}")
        return value

    def str_list(self, key: str, value: Any) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expects a non-empty list of strings, got {echo(value)}")
        if len(set(value)) != len(value):
            raise self.fail(key, f"lists a name twice: {echo(value)}")
        return list(value)

    def positive(self, key: str) -> int | None:
        value = self.get(key, (int,), "a positive integer")
        if value is not None and value < 1:
            raise self.fail(key, f"expects a positive integer, got {echo(value)}")
        if value is not None and key in BOUNDS and value > BOUNDS[key]:
            raise self.fail(key, f"must be <= {BOUNDS[key]}, got {echo(value)}")
        return value

    def grid_name(self, default_name: str) -> str:
        """The grid's name: a plain folder name (it names ``results/<name>``); the file
        name, made one, when the grid names none."""
        if "name" not in self.raw:
            safe = re.sub(r"[^A-Za-z0-9._+=-]+", "-", default_name).strip("-.")[:100]
            return safe if _GRID_NAME.match(safe) else "grid"
        name = self.get("name", (str,), "a string")
        if not _GRID_NAME.match(name):
            raise self.fail("name", f"{echo(name)} is not a plain folder name: it names the output "
                            "folder (results/<name>), so it must start with a letter or digit "
                            "and hold only letters, digits and '.', '_', '+', '=', '-' (at most "
                            "100), never '/', '..' or a space")
        return name

    # ----------------------------------------------------------------- the grid

    def parse(self, *, text: str, out: str | Path | None, default_name: str) -> Grid:
        unknown = sorted(set(self.raw) - set(KEYS))
        if unknown:
            raise self.fail(unknown[0], f"unknown top-level key; valid keys: {', '.join(KEYS)}")
        name = self.grid_name(default_name)
        description = self.get("description", (str,), "a string", "")
        out_dir = out if out is not None else self.get("out", (str,), "a folder name",
                                                        f"results/{name}")
        seeds = self.seeds()
        pairs = self.dataset_orderings()
        methods = self.methods()
        variants = self.variants(methods)
        regimes, regime_options = self.regimes()
        count = len(pairs) * sum(len(variants[m]) for m in methods) * len(regimes)
        if count > MAX_CELLS:  # counted before any cell is built or checked
            raise self.fail("datasets", f"{count} cells, more than the {MAX_CELLS} a grid may "
                            "have: split it into several grids")
        if count * len(seeds) > MAX_GRID_RUNS:
            raise self.fail("runs" if "runs" in self.raw else "seeds",
                            f"{count} cells x {len(seeds)} runs is more than the "
                            f"{MAX_GRID_RUNS} runs a sweep accepts")
        grid = Grid(
            name=name, source=self.source, text=text, cells=[], seeds=seeds, out=Path(out_dir),
            cache=self.get("cache", (str,), "a folder name"),
            data=self.get("data", (str,), "a folder name"),
            extractor=self.get("extractor", (str,), "an extractor name"),
            weights=self.get("weights", (str,), "a file name"),
            limit_per_class=self.positive("limit_per_class"),
            offline_epochs=self.positive("offline_epochs"),
            regime_options=regime_options, description=description,
            omega_events=self.omega_events())
        seen: dict[str, Cell] = {}
        for (dataset, ordering, key), method in itertools.product(pairs, methods):
            for variant, (settings, keys, origin) in variants[method].items():
                for regime in regimes:
                    base = result_path(".", dataset, ordering, method).stem
                    parts = [base] + ([variant] if variant != DEFAULT_VARIANT else [])
                    parts += [regime] if regime not in (None, "streaming") else []
                    cell = Cell("_".join(parts), dataset, ordering, method, variant, settings,
                                regime, origin, keys)
                    if cell.id in seen:
                        raise self.fail(origin, f"cell {cell.id} is defined twice")
                    seen[cell.id] = cell
                    self.check_cell(grid, cell, key)
                    grid.cells.append(cell)
        return grid

    def check_cell(self, grid: Grid, cell: Cell, dataset_key: str) -> None:
        exp = grid.experiment(cell)
        try:
            validate(exp)
        except (ValueError, FileNotFoundError) as e:
            text = str(e)
            named = [k for name, k in cell.setting_keys.items()
                     if re.search(rf"\b{re.escape(name)}\b", text)]
            key = (named[0] if len(named) == 1
                   else "regimes" if cell.regime is not None and "regime" in text
                   else dataset_key if "ordering" in text and "support" in text
                   else "extractor" if "extractor" in text
                   else "weights" if grid.weights and (grid.weights in text
                                                       or "--weights" in text)
                   else cell.origin)
            raise self.fail(key, f"cell {cell.id}: {text}") from None

    def omega_events(self) -> str:
        value = self.get("omega_events", (str,), "a string", "after_base")
        if value not in OMEGA_EVENTS:
            raise self.fail("omega_events", f"unknown value {echo(value)}; valid choices: "
                            f"{', '.join(OMEGA_EVENTS)}")
        return value

    def seeds(self) -> list[int]:
        if "runs" in self.raw and "seeds" in self.raw:
            raise self.fail("seeds", "give either runs or seeds, not both")
        if "seeds" in self.raw:
            seeds = self.raw["seeds"]
            if (not isinstance(seeds, list) or not seeds
                    or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                               for s in seeds)):
                raise self.fail("seeds", f"expects a non-empty list of integers >= 0, got "
                                f"{echo(seeds)}")
            if len(set(seeds)) != len(seeds):
                raise self.fail("seeds", f"lists a seed twice: {echo(seeds)}")
            if max(seeds) > MAX_SEED:
                raise self.fail("seeds", f"a seed must be <= {MAX_SEED}, got {max(seeds)}")
            if len(seeds) > MAX_RUNS:
                raise self.fail("seeds", f"at most {MAX_RUNS} runs per cell, got {len(seeds)}")
            return list(seeds)
        runs = self.positive("runs")
        if runs is not None and runs > MAX_RUNS:
            raise self.fail("runs", f"at most {MAX_RUNS} runs per cell, got {runs}")
        return list(range(runs if runs is not None else 3))

    def dataset_orderings(self) -> list[tuple[str, str, str]]:
        """(dataset, ordering, key to blame) for every pair, checked against the datasets."""
        from ciosl.data.datasets import get_spec
        from ciosl.data.orderings import check_kind

        if "datasets" not in self.raw:
            raise self.fail("datasets", "missing: name the datasets to run on")
        datasets = self.raw["datasets"]
        if isinstance(datasets, dict):
            if "orderings" in self.raw:
                raise self.fail("orderings", "not allowed when datasets is a table (the table "
                                "gives each dataset its orderings)")
            wanted = {name: (self.str_list(f"datasets.{name}", value), f"datasets.{name}")
                      for name, value in datasets.items()}
            if not wanted:
                raise self.fail("datasets", "the table names no dataset")
        else:
            names = self.str_list("datasets", datasets)
            if "orderings" not in self.raw:
                raise self.fail("orderings", "missing: name the orderings (or make datasets a "
                                "table of dataset -> orderings)")
            orderings = self.str_list("orderings", self.raw["orderings"])
            wanted = {name: (orderings, "orderings") for name in names}
        pairs = []
        for name, (orderings, key) in wanted.items():
            try:
                spec = get_spec(name)
            except (ValueError, FileNotFoundError) as e:
                raise self.fail("datasets", str(e)) from None
            for ordering in orderings:
                try:
                    check_kind(ordering)
                except ValueError as e:
                    raise self.fail(key, str(e)) from None
                if ordering not in spec.orderings:
                    raise self.fail(key, f"dataset {echo(name)} does not support the {echo(ordering)} "
                                    f"ordering; valid choices: {', '.join(spec.orderings)}")
                pairs.append((name, ordering, key))
        return pairs

    def methods(self) -> list[str]:
        if "methods" not in self.raw:
            raise self.fail("methods", "missing: name the methods to run")
        methods = self.str_list("methods", self.raw["methods"])
        for name in methods:
            try:
                get_method(name)
            except ValueError as e:
                raise self.fail("methods", str(e)) from None
        return methods

    def method_table(self, key: str, methods: list[str]) -> dict[str, Any]:
        table = self.get(key, (dict,), "a table of method -> settings", {})
        for method, value in table.items():
            if method not in methods:
                raise self.fail(f"{key}.{method}", f"method {echo(method)} is not in methods "
                                f"({', '.join(methods)})")
            if not isinstance(value, dict):
                raise self.fail(f"{key}.{method}", f"expects a table, got {_type_name(value)}")
        return table

    def known_setting(self, key: str, method: str, name: str) -> Setting:
        known = {s.name: s for s in get_method(method).settings() if s.name != "seed"}
        if name not in known:
            raise self.fail(key, f"unknown setting {echo(name)} for method {echo(method)}; valid "
                            f"settings: {', '.join(sorted(known)) or '(none)'}")
        return known[name]

    def setting_text(self, key: str, method: str, name: str, value: Any) -> str:
        """The --set string of a TOML value, after checking the setting exists and the type."""
        t = self.known_setting(key, method, name).type
        ok = {bool: (bool,), int: (int,), float: (int, float), str: (str,),
              type(None): (int, float, str)}.get(t)
        if t in (tuple, list):
            if not isinstance(value, list) or not all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise self.fail(key, f"expects a list of integers, got {_type_name(value)} "
                                f"{echo(value)}")
            for v in value:
                self.not_huge(key, v)
            return ",".join(str(v) for v in value)
        if ok is not None and (not isinstance(value, ok)
                               or isinstance(value, bool) and t is not bool):
            what = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
                    type(None): 'a number or "none"'}[t]
            raise self.fail(key, f"expects {what}, got {_type_name(value)} {echo(value)}")
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (dict, list)):
            raise self.fail(key, f"expects a single value, got {_type_name(value)} {echo(value)}")
        self.not_huge(key, value)
        return repr(value) if isinstance(value, float) else str(value)

    def not_huge(self, key: str, value: Any) -> None:
        """An integer of more digits than any setting takes, refused before it is written
        out (Python will not write one of more than 4300 digits)."""
        if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
            raise self.fail(key, f"expects a number of at most {MAX_INT_DIGITS} digits, got "
                            f"{echo(value)}")

    def variants(self, methods: list[str]) -> dict[str, dict[str, Variant]]:
        """method -> variant name -> (--set strings, setting -> key, the key defining it)."""
        fixed = self.method_table("settings", methods)
        grids = self.method_table("grid", methods)
        named = self.method_table("variants", methods)
        out: dict[str, dict[str, Variant]] = {}
        for method in methods:
            base = {name: self.setting_text(f"settings.{method}.{name}", method, name, value)
                    for name, value in fixed.get(method, {}).items()}
            base_keys = {name: f"settings.{method}.{name}" for name in base}
            variants: dict[str, Variant] = {}
            if method in grids:
                axes = []
                for name, values in grids[method].items():
                    key = f"grid.{method}.{name}"
                    self.known_setting(key, method, name)
                    if not isinstance(values, list) or not values:
                        raise self.fail(key, f"expects a non-empty list of values, got "
                                        f"{echo(values)}")
                    texts = [self.setting_text(key, method, name, v) for v in values]
                    if len(set(texts)) != len(texts):
                        raise self.fail(key, f"lists a value twice: {echo(values)}")
                    axes.append([(name, t) for t in texts])
                if not axes:
                    raise self.fail(f"grid.{method}", "names no setting")
                count = math.prod(len(a) for a in axes)
                if count > MAX_CELLS:
                    raise self.fail(f"grid.{method}", f"{count} combinations, more than the "
                                    f"{MAX_CELLS} cells a grid may have")
                for combo in itertools.product(*axes):
                    vname = slug_items(combo)  # file-name safe, injective
                    keys = {**base_keys, **{n: f"grid.{method}.{n}" for n, _ in combo}}
                    variants[vname] = ({**base, **dict(combo)}, keys, f"grid.{method}")
            for vname, values in named.get(method, {}).items():
                key = f"variants.{method}.{vname}"
                if not _VARIANT_NAME.match(vname):
                    raise self.fail(key, "a variant name may only hold letters, digits and "
                                    "'.', '+', '=', '-' (it becomes part of file names)")
                if not isinstance(values, dict):
                    raise self.fail(key, f"expects a table of settings, got {_type_name(values)}")
                if vname in variants:
                    raise self.fail(key, f"variant {echo(vname)} is defined twice")
                settings = {name: self.setting_text(f"{key}.{name}", method, name, value)
                            for name, value in values.items()}
                keys = {**base_keys, **{n: f"{key}.{n}" for n in settings}}
                variants[vname] = ({**base, **settings}, keys, key)
            if not variants:
                variants[DEFAULT_VARIANT] = (base, base_keys,
                                             f"settings.{method}" if base else "methods")
            out[method] = variants
        return out

    def regimes(self) -> tuple[list[str | None], dict[str, int]]:
        options = {k: self.positive(k) for k in ("batch_size", "epochs") if k in self.raw}
        if "regimes" not in self.raw:
            if options:
                key = next(iter(options))
                raise self.fail(key, "only applies with regimes = [...]")
            return [None], {}
        regimes = self.str_list("regimes", self.raw["regimes"])
        for regime in regimes:
            if regime not in REGIMES:
                raise self.fail("regimes", f"unknown regime {echo(regime)}; valid choices: "
                                f"{', '.join(REGIMES)}")
        missing = sorted({"regime", *options} - spec_fields())
        if missing:
            raise self.fail("regimes" if "regime" in missing else missing[0],
                            "this version of ciosl cannot run batch/online regimes "
                            f"(ExperimentSpec has no {', '.join(missing)} field)")
        return list(regimes), options
