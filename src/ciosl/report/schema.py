"""The schema of a result JSON, checked in one place (``result_problem``): types and known
values, ranges, shapes, seeds, then every stored summary against the per-run data it
summarises (``derivations``). Also the reading of the fields other modules need
(``regime_of``, ``known_method``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ciosl.data.orderings import OFFICIAL, ORDERINGS
from ciosl.report.text import printable, shorten

REGIME_ORDER = ("batch", "online", "streaming")


def known_method(method: str) -> type | None:
    """The learner class of a method this ciosl has registered (built in, installed as a
    plugin, or already loaded), else None. Never ``get_method``: a ``module:Class`` name read
    from a result file would import that module."""
    from ciosl.learners.base import available_methods

    return available_methods().get(method)


def regime_of(data: dict) -> str:
    """``streaming``, ``online`` or ``batch``: ``regime`` is {"name", "batch_size", "epochs"}
    in results of ``ciosl run`` (absent in older ones: streaming)."""
    regime = data.get("regime") or (data.get("sweep") or {}).get("regime") or "streaming"
    return str(regime.get("name", "streaming") if isinstance(regime, dict) else regime)


def stored_omega_events(data: dict) -> str:
    """The Omega_all definition a result was written with (unlabelled: every event)."""
    return str((data.get("omega_all") or {}).get("events", "all"))


def looks_like_result(data: Any) -> bool:
    """A JSON that means to be a result (run files, cache entries and the like do not)."""
    return isinstance(data, dict) and "omega_all" in data and "method" in data


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any, low: int | None = 0) -> bool:
    """An integer (not a bool) >= ``low`` (any with None)."""
    return isinstance(x, int) and not isinstance(x, bool) and (low is None or x >= low)


def _brief(value: Any) -> str:
    """A short, printable repr of a bad value for a warning."""
    return shorten(printable(repr(value)), 40)


def _at(name: str, problem: str | None) -> str | None:
    """``problem`` (``[i] ...`` or ``must ...``) as said of the field ``name``."""
    if problem is None:
        return None
    return f"{name}{problem if problem.startswith('[') else ' ' + problem}"


def _first(problems: Iterable[str | None]) -> str | None:
    """The first problem of a lazy sequence of checks, or None."""
    return next((p for p in problems if p is not None), None)


MAX_DEPTH = 16  # a result nests about 5 levels deep (runs[i].class_counts[t][c][k])
# Omega_all averages acc_t / offline_t with acc_t <= 1: above 100 every offline accuracy would
# be below 1%, under chance for any dataset of at most 100 classes
MAX_OMEGA = 100.0
TOLERANCE = 1e-6  # relative and absolute, between a stored summary and its recomputation


def _too_deep(data: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested more than ``limit`` levels deep, or None (iterative:
    no recursion on a hostile file)."""
    stack = [(data, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict | list):
            if depth >= limit:
                return where or "(top level)"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                name = shorten(printable(k), 20)
                stack.append((v, depth + 1, f"{where}[{k}]" if isinstance(value, list)
                              else f"{where}.{name}" if where else name))
    return None


def _in_range(values: Any, low: float, high: float, *, low_open: bool = False,
              none_ok: bool = False) -> str | None:
    """Why ``values`` is not a list of finite numbers in [low, high] ((low, high] with
    ``low_open``; None items allowed with ``none_ok``), or None."""
    if not isinstance(values, list):
        return f"must be a list, got {_brief(values)}"
    for i, x in enumerate(values):
        if x is None and none_ok:
            continue
        if not _finite(x) or x > high or x < low or (low_open and x == low):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            return f"[{i}] must be a number in {interval}, got {_brief(x)}"
    return None


def _ints(values: Any, low: int) -> str | None:
    """Why ``values`` is not a list of integers >= ``low``, or None."""
    if not isinstance(values, list):
        return f"must be a list, got {_brief(values)}"
    for i, x in enumerate(values):
        if not _int(x, low):
            return f"[{i}] must be an integer >= {low}, got {_brief(x)}"
    return None


def _matrix_problem(matrix: Any, rows: int | None, cols: int | None) -> str | None:
    """Why ``matrix`` is not ``rows`` rows (one per testing event) of ``cols`` accuracies in
    [0, 1] or None (``cols`` None: as many as its first row), or None: rectangular."""
    if not isinstance(matrix, list):
        return f"must be a list of rows, got {_brief(matrix)}"
    if rows is not None and len(matrix) != rows:
        return f"must have one row per testing event ({rows}), has {len(matrix)}"
    for t, row in enumerate(matrix):
        problem = _in_range(row, 0.0, 1.0, none_ok=True)
        if problem is not None:
            return _at(f"[{t}]", problem)
        cols = len(row) if cols is None else cols
        if len(row) != cols:
            return f"[{t}] must have one value per matrix column ({cols}), has {len(row)}"
    return None


def _counts_problem(counts: Any) -> str | None:
    """Why ``class_counts`` is not, per testing event, ``{label: [correct, n]}``, or None."""
    if not isinstance(counts, list):
        return f"must be a list, got {_brief(counts)}"
    for t, at_t in enumerate(counts):
        if not (isinstance(at_t, dict) and at_t):
            return f"[{t}] must be an object of class counts, got {_brief(at_t)}"
        for c, kn in at_t.items():
            if not (isinstance(kn, list) and len(kn) == 2 and _int(kn[1], 1)
                    and _int(kn[0]) and kn[0] <= kn[1]):
                return (f"[{t}][{_brief(c)}] must be [correct, n], 0 <= correct <= n, n >= 1, "
                        f"got {_brief(kn)}")
    return None


def _summary_problem(data: dict, key: str, low: float, high: float) -> str | None:
    """``key`` (``{"mean", "std"}``, optional) with its mean in [low, high], std >= 0."""
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not isinstance(value, dict):
        return f"{key} must be an object, got {_brief(value)}"
    mean = value.get("mean")
    if not (_finite(mean) and low <= mean <= high):
        return f"{key}.mean must be a number in [{low:g}, {high:g}], got {_brief(mean)}"
    if "std" in value and not (_finite(value["std"]) and value["std"] >= 0):
        return f"{key}.std must be a finite number >= 0, got {_brief(value['std'])}"
    return None


PER_EVENT = ("accuracy", "accuracy_offline", "n_test", "class_counts", "accuracy_matrix")


def _n_events(run: dict) -> int | None:
    """The number of testing events of a run: its events', else its first per-event list's
    length; None if it records none."""
    for key in ("events", *PER_EVENT):
        if isinstance(run.get(key), list):
            return len(run[key])
    return None


def _width(run: dict) -> int | None:
    matrix = run.get("accuracy_matrix")
    return len(matrix[0]) if matrix else None


def _common(runs: list[dict], size: Callable[[dict], int | None]) -> int | None:
    """``size`` of the first run that has one (the runs agree: ``_runs_problem``)."""
    return next((n for n in map(size, runs) if n is not None), None)


def _events_problem(run: dict, at: str, data: dict) -> str | None:
    """Events: increasing stream positions, the last the end of the stream, the stream and the
    base init the training set."""
    if "events" not in run:
        return None
    events = run["events"]
    if not (isinstance(events, list) and all(_int(x) for x in events)):
        return f"{at}.events must be a list of stream positions (integers >= 0)"
    if not events:
        return f"{at}.events must not be empty"
    for t in range(1, len(events)):
        if events[t] <= events[t - 1]:
            return (f"{at}.events must be in increasing order, got {events[t - 1]} then "
                    f"{events[t]} at [{t}]")
    for key in ("n_base", "n_stream"):
        if key in run and not _int(run[key]):
            return f"{at}.{key} must be an integer >= 0, got {_brief(run[key])}"
    if "n_stream" in run and events[-1] != run["n_stream"]:
        return (f"{at}.events must end at the end of the stream (n_stream = {run['n_stream']}), "
                f"got {events[-1]}")
    if "n_base" in run and "n_stream" in run and _int(data.get("n_train"), 1) and (
            run["n_base"] + run["n_stream"] != data["n_train"]):
        return (f"{at}: n_base + n_stream must be n_train ({data['n_train']}), got "
                f"{run['n_base']} + {run['n_stream']}")
    return None


def _lists_problem(run: dict, at: str, data: dict) -> str | None:
    """The per-event lists: values in range, one per testing event, rectangular matrices."""
    checks = {"accuracy": lambda v: _in_range(v, 0.0, 1.0),
              "accuracy_offline": lambda v: _in_range(v, 0.0, 1.0, low_open=True),
              "n_test": lambda v: _ints(v, 1), "class_counts": _counts_problem}
    for key, check in checks.items():
        if key in run:
            problem = _at(f"{at}.{key}", check(run[key]))
            if problem is not None:
                return problem
    n_test = data.get("n_test") if _int(data.get("n_test"), 1) else math.inf
    for t, n in enumerate(run.get("n_test", [])):
        if n > n_test:
            return f"{at}.n_test[{t}] must be <= n_test ({n_test}), got {n}"
    columns = run.get("matrix_columns")
    if columns is not None and not (isinstance(columns, list) and all(
            isinstance(c, list) and all(_int(x, None) for x in c) for c in columns)):
        return f"{at}.matrix_columns must be a list of lists of class labels (integers)"
    lengths = {k: len(run[k]) for k in PER_EVENT if isinstance(run.get(k), list)}
    T = _n_events(run)
    if T == 0:
        return f"{at} has no testing event"
    for k, n in lengths.items():
        if n != T:
            return f"{at}.{k} must have one value per testing event ({T}), has {n}"
    if "accuracy_matrix" in run:
        return _at(f"{at}.accuracy_matrix", _matrix_problem(
            run["accuracy_matrix"], T, None if columns is None else len(columns)))
    return None


def _values_problem(run: dict, at: str, data: dict) -> str | None:
    """A run's single values: seed, Omega_all and its definition, forgetting, class accuracies,
    speeds and memory."""
    if "omega_all" not in run and not ("accuracy" in run and "accuracy_offline" in run):
        return f"{at} has no omega_all, nor accuracy and accuracy_offline to give it"
    if "seed" in run and not _int(run["seed"]):
        return f"{at}.seed must be an integer >= 0, got {_brief(run['seed'])}"
    if "omega_all" in run:
        problem = _omega_value_problem(run["omega_all"], f"{at}.omega_all")
        if problem is not None:
            return problem
    events = stored_omega_events(data)
    if run.get("omega_events", events) != events:
        return f"{at}.omega_events is {_brief(run['omega_events'])} but omega_all.events is " \
               f"{_brief(events)}"
    if events == "after_base" and _n_events(run) == 1:
        return f"{at} has a single testing event: no Omega_all after base init"
    for key in ("forgetting", "backward_transfer"):
        if run.get(key) is not None and not (_finite(run[key]) and -1 <= run[key] <= 1):
            return f"{at}.{key} must be a number in [-1, 1], got {_brief(run[key])}"
    per_class = run.get("final_class_accuracy")
    if per_class is not None:
        if not isinstance(per_class, dict):
            return f"{at}.final_class_accuracy must be an object, got {_brief(per_class)}"
        for c, a in per_class.items():
            if not (_finite(a) and 0 <= a <= 1):
                return (f"{at}.final_class_accuracy[{_brief(c)}] must be a number in [0, 1], "
                        f"got {_brief(a)}")
    for key in ("samples_per_second", "learn_seconds", "predict_seconds"):
        if run.get(key) is not None and not (_finite(run[key]) and run[key] >= 0):
            return f"{at}.{key} must be a finite number >= 0, got {_brief(run[key])}"
    if run.get("peak_memory_bytes") is not None and not _int(run["peak_memory_bytes"]):
        return f"{at}.peak_memory_bytes must be an integer >= 0, got " \
               f"{_brief(run['peak_memory_bytes'])}"
    return None


def _run_problem(run: Any, i: int, data: dict) -> str | None:
    """Why run ``i`` of a result cannot be used: its events, its per-event lists (values in
    range, one per testing event, rectangular matrices) or its single values."""
    if not isinstance(run, dict):
        return f"runs[{i}] must be an object, got {_brief(run)}"
    at = f"runs[{i}]"
    return _first(check(run, at, data) for check in
                  (_events_problem, _lists_problem, _values_problem))


def _seeds_problem(data: dict) -> str | None:
    """Seeds: distinct integers >= 0, one per run, each the seed its run records (a result
    without ``seeds``: its runs' own seeds distinct)."""
    runs, seeds = data["runs"], data.get("seeds")
    if seeds is not None and not (isinstance(seeds, list) and all(_int(s) for s in seeds)):
        return f"seeds must be a list of integers >= 0, got {_brief(seeds)}"
    listed = seeds if seeds is not None else [r["seed"] for r in runs if "seed" in r]
    seen: set[int] = set()
    for s in listed:
        if s in seen:
            who = "seeds lists" if seeds is not None else "the runs' seed fields list"
            return f"{who} seed {s} more than once (a repeated seed repeats the same run)"
        seen.add(s)
    if seeds is not None and len(seeds) != len(runs):
        return f"seeds must have one seed per run ({len(runs)}), has {len(seeds)}"
    for i, (s, run) in enumerate(zip(seeds or [], runs, strict=False)):
        if run.get("seed", s) != s:
            return f"runs[{i}].seed is {run['seed']} but seeds[{i}] is {s}"
    return None


# what the runs of one result record alike (per-class counts and what comes of them may be
# missing from the runs a sweep kept from an older ciosl)
RECORDED_BY_EVERY_RUN = ("seed", "events", "n_test", "accuracy", "accuracy_offline",
                         "omega_all", "omega_events")


def _runs_problem(data: dict) -> str | None:
    """The runs of one result agree: the same fields recorded, as many testing events,
    matrices as wide, the same classes at the end; seeds."""
    runs = data["runs"]
    recorded = [set(RECORDED_BY_EVERY_RUN).intersection(r) for r in runs]
    for i, keys in enumerate(recorded):
        odd = min(keys ^ recorded[0], default=None)
        if odd is not None:
            field = _brief(odd)
            return (f"runs[{i}] {'records' if odd in keys else 'does not record'} {field}, "
                    f"runs[0] {'does' if odd in recorded[0] else 'does not'}")
    for key, size in (("testing events", _n_events), ("accuracy_matrix columns", _width)):
        sizes = [size(r) for r in runs]
        first = next((k for k, n in enumerate(sizes) if n is not None), 0)
        for i, n in enumerate(sizes):
            if n is not None and n != sizes[first]:
                return f"runs[{i}] has {n} {key}, runs[{first}] has {sizes[first]}"
    classes = [set(r.get("final_class_accuracy") or ()) for r in runs]
    first = next((k for k, c in enumerate(classes) if c), 0)
    for i, c in enumerate(classes):
        if c and c != classes[first]:
            odd = min(c ^ classes[first])
            return (f"runs[{i}].final_class_accuracy has {_has(c, odd)}, runs[{first}]'s has "
                    f"{_has(classes[first], odd)}")
    names = data.get("class_names")
    if isinstance(names, list):  # the labels are indices into class_names
        odd = next((c for c in sorted(classes[first], key=str)
                    if not (isinstance(c, str) and c.isascii() and c.isdigit()
                            and int(c) < len(names))), None)
        if odd is not None:
            return (f"runs[{first}].final_class_accuracy has class {_brief(odd)}, which the "
                    f"{len(names)} class_names do not name")
    return _seeds_problem(data)


def _setting_value(value: Any) -> bool:
    """A value a setting can have in a result: a string, a finite number (an integer within
    64 bits), true, false, null, or a flat list of them."""
    def scalar(v: Any) -> bool:
        return (v is None or isinstance(v, str | bool) or _finite(v)
                and (not isinstance(v, int) or abs(v) < 2 ** 63))
    return scalar(value) or (isinstance(value, list) and all(map(scalar, value)))


def _has(classes: set, c: str) -> str:
    return f"{'' if c in classes else 'no '}class {_brief(c)}"


def _regime_problem(regime: Any, name: str) -> str | None:
    """``regime``: a known regime's name, or {"name", "batch_size", "epochs"} (optional)."""
    if regime is None:
        return None
    if isinstance(regime, dict):
        for key in ("batch_size", "epochs"):
            if regime.get(key) is not None and not _int(regime[key], 1):
                return f"{name}.{key} must be an integer >= 1, got {_brief(regime[key])}"
        value, name = regime.get("name", "streaming"), f"{name}.name"
    elif isinstance(regime, str):
        value = regime
    else:
        return f"{name} must be an object or a string, got {_brief(regime)}"
    if value not in REGIME_ORDER:
        return f"{name} must be one of {', '.join(REGIME_ORDER)}, got {_brief(value)}"
    return None


def _header_problem(data: dict) -> str | None:
    """The fields around the runs: sizes, regime, sweep, types."""
    for key in ("n_train", "n_test", "feature_dim"):
        if data.get(key) is not None and not _int(data[key], 1):
            return f"{key} must be an integer >= 1, got {_brief(data[key])}"
    for key in ("limit_per_class", "peak_memory_bytes"):
        if data.get(key) is not None and not _int(data[key]):
            return f"{key} must be an integer >= 0, got {_brief(data[key])}"
    for key in ("samples_per_second", "predict_seconds"):
        if data.get(key) is not None and not (_finite(data[key]) and data[key] >= 0):
            return f"{key} must be a finite number >= 0, got {_brief(data[key])}"
    for key, kind in (("settings", dict), ("sweep", dict), ("versions", dict),
                      ("extractor", str), ("features_key", str), ("regime", dict | str)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"{key} has the wrong type, got {_brief(data[key])}"
    sweep = data.get("sweep") or {}
    if sweep.get("set") is not None and not isinstance(sweep["set"], dict):
        return f"sweep.set must be an object, got {_brief(sweep['set'])}"
    for key, settings in (("settings", data.get("settings")), ("sweep.set", sweep.get("set"))):
        odd = next((k for k, v in (settings or {}).items() if not _setting_value(v)), None)
        if odd is not None:
            return (f"{key}.{shorten(printable(odd), 20)} must be a string, a finite number, "
                    f"true, false, null or a list of them, got {_brief(settings[odd])}")
    if "variant" in sweep and not isinstance(sweep["variant"], str):
        return f"sweep.variant must be a string, got {_brief(sweep['variant'])}"
    names = data.get("class_names")
    if names is not None and not (isinstance(names, list) and names
                                  and all(isinstance(n, str) for n in names)):
        return f"class_names must be a non-empty list of strings, got {_brief(names)}"
    return (_regime_problem(data.get("regime"), "regime")
            or _regime_problem(sweep.get("regime"), "sweep.regime") or _violation_problem(data))


def _violation_problem(data: dict) -> str | None:
    """``violates_single_pass``: true or false, and true exactly when the method (if known
    here) or the batch regime breaks single pass."""
    if "violates_single_pass" not in data:
        return None
    flag = data["violates_single_pass"]
    if not isinstance(flag, bool):
        return f"violates_single_pass must be true or false, got {_brief(flag)}"
    cls = known_method(data["method"])  # unknown here: only the batch regime is known to break
    method = None if cls is None else bool(cls.violates_single_pass)
    batch = regime_of(data) == "batch"
    if (batch and not flag) or (method is not None and flag != (method or batch)):
        why = ("the batch regime breaks single pass" if batch else
               f"method {_brief(data['method'])} {'breaks' if method else 'keeps'} single pass")
        return f"violates_single_pass is {str(flag).lower()} but {why}"
    return None


def _omega_value_problem(value: Any, name: str) -> str | None:
    if not _finite(value):
        return f"{name} must be a finite number, got {_brief(value)}"
    if value < 0:
        return f"{name} must be >= 0, got {_brief(value)}"
    if value > MAX_OMEGA:
        return (f"{name} must be <= {MAX_OMEGA:g} (a mean of accuracy / offline accuracy), "
                f"got {_brief(value)}")
    return None


def _omega_problem(data: dict) -> str | None:
    from ciosl.evaluation.metrics import OMEGA_EVENTS

    om = data["omega_all"]
    if not isinstance(om, dict):
        return f"omega_all.mean must be a finite number, got {_brief(om)}"
    if "events" in om and om["events"] not in OMEGA_EVENTS:
        return (f"omega_all.events must be one of {', '.join(OMEGA_EVENTS)}, got "
                f"{_brief(om['events'])}")
    if "std" in om and not (_finite(om["std"]) and om["std"] >= 0):
        return f"omega_all.std must be a finite number >= 0, got {_brief(om['std'])}"
    return _omega_value_problem(om.get("mean"), "omega_all.mean")


def result_problem(data: dict) -> str | None:
    """Why a result JSON cannot be used (None: it can), naming the field: nesting; types and
    known values; ranges (accuracies in [0, 1], offline accuracies > 0, Omega_all at most
    ``MAX_OMEGA``); shapes (one value per testing event, rectangular matrices, runs that agree);
    seeds (distinct, one per run); then every stored summary against the per-run data it
    summarises (``_derivations``)."""
    deep = _too_deep(data)
    if deep is not None:
        return f"{deep} is nested more than {MAX_DEPTH} levels deep"
    for k in ("method", "dataset", "ordering"):
        if not isinstance(data.get(k), str):
            return f"{k} must be a string, got {_brief(data.get(k))}"
        if not data[k].strip():
            return f"{k} must not be empty, got {_brief(data[k])}"
    if data["ordering"] not in ORDERINGS + OFFICIAL:
        return f"ordering must be one of {', '.join(ORDERINGS + OFFICIAL)}, got {_brief(data['ordering'])}"
    problem = _omega_problem(data) or _header_problem(data)
    if problem is not None:
        return problem
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        return f"runs must be a non-empty list, got {_brief(runs)}"
    problem = _first(_run_problem(run, i, data) for i, run in enumerate(runs))
    problem = problem or _runs_problem(data) or _first(
        _summary_problem(data, key, low, high) for key, low, high in (
            ("final_accuracy", 0.0, 1.0), ("forgetting", -1.0, 1.0),
            ("backward_transfer", -1.0, 1.0)))
    if problem is None and data.get("accuracy_matrix") is not None:
        problem = _at("accuracy_matrix", _matrix_problem(
            data["accuracy_matrix"], _common(runs, _n_events), _common(runs, _width)))
    from ciosl.report.derivations import _contradiction

    return problem or _contradiction(data)
