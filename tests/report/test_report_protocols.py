"""`ciosl report` never puts results of different protocols in one column or one comparison,
and says which it keeps apart.

Before: tinyer ``--limit-per-class 20`` at ``--offline-epochs 1`` and at 2, plus ``--set
lr=0.05`` at 1, gave a table "Omega_all as a function of lr" comparing lr 0.01 at 2 offline
epochs with lr 0.05 at 1 and bolding the second; two results that differed only in their
offline epochs were "duplicates", one of them dropped. A column is now (ordering, dataset,
``--limit-per-class``, extractor, protocol): the offline reference's settings, the base
fraction, the classes per step, and the online / batch regimes' options.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from ciosl.report.build import write_report
from ciosl.report.results import drop_duplicates, load_entries


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    """Real results of NCM on a digits subset: (temperature, offline epochs) -> file."""
    folder = tmp_path_factory.mktemp("results")
    out = {}
    for temperature, epochs in [(None, 1), (None, 2), ("0.5", 1), ("0.5", 2)]:
        spec = ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm", seeds=[0],
                              limit_per_class=12, offline_epochs=epochs, out_dir=folder,
                              cache_dir=folder / "cache",
                              settings={"temperature": temperature} if temperature else {})
        out[f"T={temperature or 'default'}@{epochs}"] = Path(run_experiment(spec)["path"])
    return out


def folder_of(tmp: Path, results: dict[str, Path], keys: list[str]) -> Path:
    folder = tmp / "r"
    folder.mkdir()
    for key in keys:
        shutil.copy(results[key], folder / results[key].name)
    return folder


def setting_points(report) -> dict[str, list[str]]:
    """For the table "Omega_all as a function of temperature": column title -> the values
    compared in it."""
    (table,) = [t for t in report.tables if t.setting == "temperature"] or [None]
    if table is None:
        return {}
    return {" · ".join(c): [row[0] for row in table.rows if row[1 + j] != "–"]
            for j, c in enumerate(table.columns)}


# (results in the folder, columns of the main table, the temperature comparisons made)
CASES = [
    ("two offline epochs, default settings", ["T=default@1", "T=default@2"],
     ["digits ≤12/class (offline_epochs=1)", "digits ≤12/class (offline_epochs=2)"], {}),
    ("a setting at another protocol", ["T=default@2", "T=0.5@1"],
     ["digits ≤12/class (offline_epochs=2)"], {}),
    ("a setting at each protocol", ["T=default@1", "T=default@2", "T=0.5@1", "T=0.5@2"],
     ["digits ≤12/class (offline_epochs=1)", "digits ≤12/class (offline_epochs=2)"],
     {"class-iid · digits ≤12/class (offline_epochs=1) · NCM": ["0.5", "1.0"],
      "class-iid · digits ≤12/class (offline_epochs=2) · NCM": ["0.5", "1.0"]}),
    ("a setting at one protocol of two", ["T=default@1", "T=default@2", "T=0.5@1"],
     ["digits ≤12/class (offline_epochs=1)", "digits ≤12/class (offline_epochs=2)"],
     {"class-iid · digits ≤12/class (offline_epochs=1) · NCM": ["0.5", "1.0"]}),
]


@pytest.mark.parametrize("case,keys,main_columns,compared", CASES, ids=[c[0] for c in CASES])
def test_results_of_different_protocols_never_share_a_column(tmp_path, results, case, keys,
                                                               main_columns, compared):
    report = write_report(folder_of(tmp_path, results, keys), out=tmp_path / "report.md")
    main = report.tables[0]
    assert [label for _, label in main.columns] == main_columns
    assert setting_points(report) == compared
    assert report.duplicates == []  # another protocol is not a duplicate to drop
    for table in report.tables:  # no series (a column of a comparison) holds two protocols
        for _, points in table.series:
            assert len({json.dumps(e.data["protocol"], sort_keys=True)
                        for _, e in points}) == 1, table.title
    (apart,) = [line for line in report.intro if "kept in separate columns" in line]
    assert "offline_epochs=1" in apart and "offline_epochs=2" in apart


def test_a_result_of_an_older_ciosl_without_a_protocol_is_kept_apart(tmp_path, results):
    folder = folder_of(tmp_path, results, ["T=default@2"])
    old = json.loads(results["T=0.5@2"].read_text())
    del old["protocol"]  # as written before results recorded their protocol
    (folder / "old.json").write_text(json.dumps(old))
    entries, duplicates = drop_duplicates(load_entries(folder))
    labels = sorted(e.column.label for e in entries)
    assert labels == ["digits ≤12/class (offline_epochs=2)",
                      "digits ≤12/class (protocol=not recorded)"]


def test_a_single_protocol_changes_no_label(tmp_path, results):
    folder = folder_of(tmp_path, results, ["T=default@2", "T=0.5@2"])
    entries = load_entries(folder)
    assert {e.column.label for e in entries} == {"digits ≤12/class (offline_epochs=2)"}
    assert len({e.column for e in entries}) == 1  # one column: both ran one protocol
