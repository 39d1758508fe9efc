"""`ciosl report`: the paper's tables (bold best single-pass method, daggers, ablations), PNG
figures, and an HTML page that a real browser renders with every image loaded."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest
import torch

from ciosl.cli import main
from ciosl.data.datasets import get_spec
from ciosl.evaluation.experiment import ExperimentSpec, resolve_settings, run_experiment
from ciosl.evaluation.metrics import mean_matrix, mean_std, omega_all, summary
from ciosl.learners.base import get_method
from ciosl.report.build import write_report
from ciosl.report.departures import EVIDENCE
from ciosl.report.results import load_entries

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CIOSL = "CIOSL (ours)"  # one row; its departures from the paper are letters in its cells
CLIP = "max_grad_norm=1.0"  # the MLP heads' gradient clipping: not the paper's plain SGD
# CIOSL's departures from the paper: its KL and distillation weights, distilling on class
# growth, the Bayesian head's clipping and cold posterior (T = 1e-4)
CIOSL_DEPARTS = ("distill_when=class_growth, lambda1=30.0, lambda2=0.1, max_grad_norm=3.0, "
                 "temperature=0.0001")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict:
    """A real result JSON (ncm on a small digits subset), the model for the others."""
    cache = tmp_path_factory.mktemp("cache")
    return run_experiment(ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm",
                                         seeds=[0, 1], limit_per_class=10, cache_dir=cache))


def summarise(data: dict) -> dict:
    """``data`` with every summary recomputed from its runs, as ``ciosl run`` writes them (the
    report refuses a result whose summaries its runs contradict)."""
    runs = data["runs"]
    events = data["omega_all"].get("events", "all")
    for run in runs:
        run["omega_all"] = omega_all(run["accuracy"], run["accuracy_offline"], events=events)
    mean, std = mean_std([run["omega_all"] for run in runs])
    data["omega_all"] = {**data["omega_all"], "mean": mean, "std": std}
    data["final_accuracy"] = summary([run["accuracy"][-1] for run in runs])
    for key in ("forgetting", "backward_transfer"):
        if key in data:
            data[key] = summary([run.get(key) for run in runs])
    if data.get("accuracy_matrix") is not None:
        data["accuracy_matrix"] = mean_matrix([run.get("accuracy_matrix") for run in runs])
    data.update(seeds=[run["seed"] for run in runs],
                peak_memory_bytes=max(run["peak_memory_bytes"] for run in runs),
                samples_per_second=sum(r["samples_per_second"] for r in runs) / len(runs))
    return data


def fake(template: dict, folder: Path, method: str, ordering: str, omega: float,
         name: str | None = None, regime: str | None = None, **overrides) -> Path:
    """A result as `ciosl run --method METHOD --set ...` writes it, with Omega_all ``omega``
    ± 0.01 over its two runs (their accuracy / offline accuracy is ``omega`` at the first and
    last events, ``omega`` ± a step between) and the final accuracy ``omega`` times the
    offline learner's. Its runs keep the template's accuracy matrices, not its class counts
    (which give the template's accuracies)."""
    cls = get_method(method)
    settings = {s.name: s.default for s in cls.settings() if s.name != "seed"}  # as a run
    settings.update(resolve_settings(cls, get_spec("digits"), ordering, None,
                                     {k: str(v) for k, v in overrides.items()}))
    data = copy.deepcopy(template)
    data.update(method=method, ordering=ordering,
                violates_single_pass=cls.violates_single_pass or regime == "batch",
                settings={**settings, "seed": "per run"})
    data.pop("path", None)
    for run, sign in zip(data["runs"], (-1, 1), strict=True):
        T = len(run["accuracy_offline"])  # Omega_all averages events 1..T-1, T-2 of them inside
        step = sign * 0.01 / 2 ** 0.5 * (T - 1) / (T - 2)  # the two runs' std: 0.01
        ratios = [omega] + [omega + step] * (T - 2) + [omega]
        run["accuracy"] = [min(1.0, max(0.0, a * r))
                           for a, r in zip(run["accuracy_offline"], ratios, strict=True)]
        del run["class_counts"], run["matrix_columns"]
    summarise(data)
    if regime is not None:
        data["regime"] = {**data["regime"], "name": regime}
    name = name or "_".join([ordering, method, *(f"{k}{v}" for k, v in overrides.items()),
                             *([regime] if regime else [])])
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def results(template, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("results")
    main = [("finetune", "class_iid", 0.40), ("gdumb", "class_iid", 0.97),
            ("tinyer", "class_iid", 0.93), ("ncm", "class_iid", 0.60),
            ("ciosl", "class_iid", 0.95), ("tinyer", "iid", 0.96), ("ciosl", "iid", 0.90),
            ("finetune", "iid", 0.30)]
    for method, ordering, omega in main:
        fake(template, folder / "main", method, ordering, omega)
    sampling = {("uniform", "lawrrr"): 0.91, ("lapn", "lawrrr"): 0.94,
                ("uniform", "lawcbr"): 0.88, ("uapn", "lawcbr"): 0.89, ("lapn", "lawcbr"): 0.96}
    for (selection, replacement), omega in sampling.items():
        fake(template, folder / "sampling", "ciosl", "class_iid", omega, selection=selection,
             replacement=replacement)
    for value, omega in [(0.0, 0.85), (0.3, 0.92), (0.5, 0.94), (1.0, 0.90)]:
        fake(template, folder / "lambda2", "ciosl", "class_iid", omega, lambda2=value)
    for value, omega in [(20, 0.80), (50, 0.90)]:
        fake(template, folder / "buffer", "ciosl", "class_iid", omega, buffer=value)
    for method, regime, omega in [("tinyer", "batch", 0.81), ("tinyer", "online", 0.71),
                                  ("ciosl", "batch", 0.85)]:
        fake(template, folder / "regimes", method, "class_iid", omega, regime=regime)
    fake(template, folder / "other", "ciosl", "class_iid", 0.5, lambda1=0.5, n_replay=8)
    # a sweep's run file and an unrelated JSON are not results
    (folder / "main" / "runs" / "x").mkdir(parents=True)
    (folder / "main" / "runs" / "x" / "seed-0.json").write_text(
        json.dumps({"seed": 0, "run": template["runs"][0], "fingerprint": "f"}))
    (folder / "notes.json").write_text("[1, 2]")
    (folder / "main" / "sweep-demo.toml").write_text('name = "demo"\nmethods = ["ncm"]\n')
    return folder


@pytest.fixture(scope="module")
def html_report(results, tmp_path_factory):
    return write_report(results, fmt="html", out=tmp_path_factory.mktemp("html") / "r.html")


def rows(table) -> dict[str, list[str]]:
    return {" / ".join(r[:len(table.stub)]): r[len(table.stub):] for r in table.rows}


def marks(table) -> dict[tuple[str, str], str]:
    """(row label, column header) -> what the cell's departure letters stand for."""
    header = table.header()[len(table.stub):]
    legend = dict(table.legend)

    def spelled(letter: str) -> str:  # "c: b + x=1" spelled out in full
        what = legend[letter]
        base, _, rest = what.partition(" + ")
        return f"{spelled(base)}, {rest}" if base in legend and rest else what

    return {(" / ".join(table.rows[i][:len(table.stub)]), "label" if j < 0 else header[j]):
            "; ".join(spelled(x) for x in m.split(",")) for (i, j), m in table.marks.items()}


def settings_set(text: str) -> set[str]:
    return set(text.split(", "))


def bold_cells(table) -> set[tuple[str, str]]:
    header = table.header()[len(table.stub):]
    return {(" / ".join(table.rows[i][:len(table.stub)]), header[j]) for i, j in table.bold}


def test_every_result_is_read_recursively_and_nothing_else(results):
    entries = load_entries(results)
    assert len(entries) == 8 + 5 + 4 + 2 + 3 + 1
    assert {e.regime for e in entries} == {"streaming", "batch", "online"}


def test_main_table_bolds_the_best_single_pass_method_and_marks_violations(html_report):
    table = html_report.tables[0]
    assert table.kind == "main"
    assert table.header() == ["Method", "iid · digits ≤10/class", "class-iid · digits ≤10/class"]
    got = rows(table)
    # one row per method: the defaults that are not the paper's are letters in the cells
    assert list(got) == ["Fine-Tune", "GDumb †", "TinyER", "NCM", CIOSL,
                         "Offline accuracy (Offline-hat)"]
    assert got["GDumb †"] == ["–", "0.9700 ± 0.0100"]
    assert got[CIOSL] == ["0.9000 ± 0.0100", "0.9500 ± 0.0100"]
    # GDumb is higher on class-iid but retrains before inference: CIOSL gets the bold
    assert bold_cells(table) == {("TinyER", "iid · digits ≤10/class"),
                                 (CIOSL, "class-iid · digits ≤10/class")}
    assert any("†" in n and "single-pass" in n for n in table.notes)
    got_marks = marks(table)
    iid, cls = "iid · digits ≤10/class", "class-iid · digits ≤10/class"
    assert got_marks[("Fine-Tune", iid)] == got_marks[("TinyER", cls)] == CLIP
    assert ("GDumb †", cls) not in got_marks and ("NCM", cls) not in got_marks
    assert got_marks[("Fine-Tune", cls)] == CLIP
    # on iid the protocol's tighter prior (N(0, 0.3^2 / fan_in)) is one more departure
    assert settings_set(got_marks[(CIOSL, cls)]) == settings_set(CIOSL_DEPARTS)
    assert settings_set(got_marks[(CIOSL, iid)]) == settings_set(CIOSL_DEPARTS) | {
        "prior_scale=0.3"}
    # each departure spelled out once: the larger set refers to the smaller one's letter
    legend = dict(table.legend)
    assert sum(what.count("lambda1=30.0") for what in legend.values()) == 1
    assert all(len(label) <= 60 for label in got)
    assert float(got["Offline accuracy (Offline-hat)"][1]) > 0.5


def test_a_default_that_departs_from_the_paper_on_one_ordering_is_labelled_there(template,
                                                                                 tmp_path):
    """CIOSL replays uniformly on the instance ordering where the paper uses UAPN: that cell's
    row says so; on iid (uniform) and the class orderings (UAPN) it follows the paper."""
    for ordering in ("iid", "instance", "class_instance"):
        fake(template, tmp_path, "ciosl", ordering, 0.9)
    got = {e.column.ordering: e for e in load_entries(tmp_path)}
    assert got["instance"].unpaper["selection"] == "uniform"
    assert got["instance"].unpaper["prior_scale"] == 0.3
    assert {e.label for e in got.values()} == {CIOSL}  # one row, whatever the departures
    assert set(got["iid"].departures) == set(got["class_instance"].departures) | {"prior_scale"}
    assert set(got["instance"].departures) == set(got["iid"].departures) | {"selection"}
    assert got["iid"].effective["selection"] == "uniform"
    assert got["class_instance"].effective["selection"] == "uapn"


def test_a_result_written_before_a_setting_existed_is_read_at_the_value_it_ran_at(template,
                                                                                  tmp_path):
    """CIOSL's fisher_decay was the constant 0.01 before it was a setting (default 0.001 now): a
    result that does not record it ran at 0.01, so it is a variant, not the default row."""
    old = fake(template, tmp_path, "ciosl", "class_iid", 0.9, name="old")
    data = json.loads(old.read_text())
    del data["settings"]["fisher_decay"]
    old.write_text(json.dumps(data))
    fake(template, tmp_path, "ciosl", "class_iid", 0.95, name="new")
    vcl = fake(template, tmp_path, "vcl", "class_iid", 0.4, name="vcl")
    data = json.loads(vcl.read_text())
    del data["settings"]["fisher_decay"]
    vcl.write_text(json.dumps(data))
    got = {e.path.stem: e for e in load_entries(tmp_path)}
    assert got["old"].effective["fisher_decay"] == 0.01
    assert got["old"].diff == {"fisher_decay": 0.01}
    assert got["new"].diff == {} and got["new"].effective["fisher_decay"] == 0.001
    assert got["vcl"].diff == {}  # VCL's default is still the old constant


def test_settings_a_sweep_grid_fixes_stay_in_the_main_table_with_a_label(template, tmp_path):
    def swept(path: Path, variant: str, given: dict) -> None:
        data = json.loads(path.read_text())
        data["sweep"] = {"grid": "g", "cell": path.stem, "variant": variant, "set": given,
                         "regime": None, "fingerprint": "f"}
        path.write_text(json.dumps(data))

    swept(fake(template, tmp_path, "finetune", "class_iid", 0.45, lr=0.001), "default",
          {"lr": "0.001"})  # [settings.finetune] lr = 0.001: the grid's protocol
    swept(fake(template, tmp_path, "agem", "class_iid", 0.55, lr=0.001, name="grid-lr"),
          "lr-0.001", {"lr": "0.001"})  # [grid.agem] lr = [...]: an ablation
    fake(template, tmp_path, "mas", "class_iid", 0.35, lr=0.001)  # ciosl run --set lr=0.001
    fake(template, tmp_path, "ciosl", "class_iid", 0.95)

    report = write_report(tmp_path, fmt="md")
    main = report.tables[0]
    assert main.kind == "main"
    assert list(rows(main)) == ["Fine-Tune (lr=0.001)", CIOSL, "Offline accuracy (Offline-hat)"]
    assert rows(main)["Fine-Tune (lr=0.001)"] == ["0.4500 ± 0.0100"]
    assert marks(main)[("Fine-Tune (lr=0.001)", "class-iid · digits ≤10/class")] == CLIP
    assert any("[settings.METHOD]" in n for n in main.notes)
    elsewhere = {r[0] for t in report.tables[1:] for r in t.rows}
    assert {"A-GEM", "MAS"} <= elsewhere  # the ablation tables name what they vary
    text = report.path.read_text()
    assert "| Fine-Tune (lr=0.001) | 0.4500 ± 0.0100ᵃ |" in text
    assert "a: max_grad_norm=1.0;" in text

    # the regimes table labels its rows the same way
    folder = tmp_path / "regimes"
    for regime, omega in [(None, 0.6), ("batch", 0.7)]:
        swept(fake(template, folder, "vcl", "class_iid", omega, regime=regime, lr=0.001),
              "default", {"lr": "0.001"})
    regimes = [t for t in write_report(folder, fmt="md").tables if t.kind == "regimes"][0]
    assert rows(regimes) == {"VCL (lr=0.001)": ["0.7000 ± 0.0100", "0.6000 ± 0.0100"]}
    assert set(marks(regimes).values()) == {"max_grad_norm=3.0, temperature=0.0001"}


def test_old_results_get_the_same_omega_all_definition_as_new_ones(template, tmp_path, capsys):
    """A result written before the base event was left out (no ``omega_all.events``: every
    event averaged, only non-default settings recorded) is recomputed from its per-event
    accuracies, so it never mixes with new results' definition; the report says so."""
    old = fake(template, tmp_path, "finetune", "class_iid", 0.0)
    data = json.loads(old.read_text())
    for run in data["runs"]:  # base event: as good as offline; after it: half as good
        run["accuracy"] = [run["accuracy_offline"][0]] + [0.5 * a for a in
                                                          run["accuracy_offline"][1:]]
        run["omega_all"] = (1.0 + 0.5 * 4) / 5  # what the old runner stored: 0.6
        run.pop("omega_events", None)
    data["omega_all"] = {"mean": 0.6, "std": 0.0}  # the old format: no label
    data["settings"] = {"seed": "per run"}  # the old format: only non-default settings
    old.write_text(json.dumps(summarise(data)))
    assert data["omega_all"] == pytest.approx({"mean": 0.6, "std": 0.0})  # as the old runner
    fake(template, tmp_path, "tinyer", "class_iid", 0.9)  # a new result

    report = write_report(tmp_path, fmt="md")
    got = rows(report.tables[0])
    # after base init: 0.5, not the stored 0.6; written before gradient clipping existed, it
    # ran the paper's plain SGD and is labelled as such (no max_grad_norm in its name)
    assert got["Fine-Tune"] == ["0.5000 ± 0.0000"]
    assert ("Fine-Tune", "class-iid · digits ≤10/class") not in marks(report.tables[0])
    assert got["TinyER"] == ["0.9000 ± 0.0100"]  # labelled after_base: used as stored
    assert marks(report.tables[0])[("TinyER", "class-iid · digits ≤10/class")] == CLIP
    finetune = next(e for e in report.entries if e.method == "finetune")
    assert finetune.recomputed and finetune.legacy and not finetune.diff
    assert any("over the testing events after base init" in n for n in report.tables[0].notes)
    text = report.path.read_text()
    assert "Omega_all: mean over the testing events after base init" in text
    assert "1 of the results were written with the other definition" in text
    assert "1 of the results were written by an older ciosl" in text

    every = write_report(tmp_path, fmt="md", omega_events="all", out=tmp_path / "all.md")
    got = rows(every.tables[0])
    assert got["Fine-Tune"] == ["0.6000 ± 0.0000"]  # stored under that definition
    assert float(got["TinyER"][0].split()[0]) == pytest.approx(0.9, abs=0.02)
    assert any("every testing event, base init included" in n for n in every.tables[0].notes)

    assert main(["report", str(tmp_path), "--omega-events", "all", "--out",
                 str(tmp_path / "cli.md")]) == 0
    assert "mean over every testing event" in (tmp_path / "cli.md").read_text()

    # a result that cannot be recomputed (no per-event accuracies) is left out, and said so
    data["runs"] = [{k: v for k, v in r.items() if k != "accuracy_offline"}
                    for r in data["runs"]]
    (tmp_path / "broken.json").write_text(json.dumps(data))
    report = write_report(tmp_path, fmt="md", out=tmp_path / "r2.md")
    assert len(report.entries) == 2
    assert any(line.startswith("Left out: broken.json") for line in report.intro)


def test_final_accuracy_and_cost_tables_follow_the_main_table(html_report, template):
    main, final, cost = html_report.tables[:3]
    assert (final.kind, cost.kind) == ("final", "cost")
    assert [r[0] for r in final.rows[:-1]] == [r[0] for r in main.rows[:-1]]
    assert final.header() == main.header()
    offline_last = [r["accuracy_offline"][-1] for r in template["runs"]]
    expected = sum(min(1.0, a * 0.95) for a in offline_last) / len(offline_last)
    assert rows(final)[CIOSL][1] == f"{100 * expected:.2f} ± 0.00"
    assert rows(final)["Offline learner"][1] == f"{100 * sum(offline_last) / 2:.2f}"
    # GDumb (0.97 x offline) is higher but violates single pass: CIOSL's 0.95 gets the bold
    assert (CIOSL, "class-iid · digits ≤10/class") in bold_cells(final)

    assert cost.columns == [("digits ≤10/class", "samples/s"), ("digits ≤10/class", "state MiB")]
    speeds = sorted(r["samples_per_second"] for r in template["runs"])  # class-iid's row
    speed, state = rows(cost)[CIOSL]
    assert speed == f"{sorted(speeds)[len(speeds) // 2]:,.0f}"
    assert float(state) == pytest.approx(template["peak_memory_bytes"] / 2 ** 20, abs=0.01)


def test_ablation_tables(html_report):
    by_kind = {}
    for t in html_report.tables:
        by_kind.setdefault(t.kind, []).append(t)
    assert [t.kind for t in html_report.tables] == ["main", "final", "cost", "forgetting", "bwt",
                                                    "classes", "classes", "sampling",
                                                    "setting", "setting", "regimes", "other"]
    sampling = rows(by_kind["sampling"][0])
    assert list(sampling) == ["LAWCBR / Uniform", "LAWCBR / UAPN", "LAWCBR / LAPN",
                              "LAWRRR / Uniform", "LAWRRR / UAPN", "LAWRRR / LAPN"]
    assert sampling["LAWRRR / UAPN"] == ["0.9500 ± 0.0100"]  # the default result
    assert bold_cells(by_kind["sampling"][0]) == {("LAWCBR / LAPN", "class-iid · digits ≤10/class")}

    lam, buf = by_kind["setting"]
    assert (lam.setting, buf.setting) == ("lambda2", "buffer")
    assert list(rows(lam)) == ["0.0", "0.1", "0.3", "0.5", "1.0"]
    assert rows(lam)["0.1"] == ["0.9500 ± 0.0100"]  # the default result
    assert list(rows(buf)) == ["20", "50", "100"]  # 100: digits' default buffer

    regimes = by_kind["regimes"][0]
    assert [lab for _, lab in regimes.columns] == ["batch", "online", "streaming"]
    assert rows(regimes)["TinyER"] == ["0.8100 ± 0.0100", "0.7100 ± 0.0100",
                                            "0.9300 ± 0.0100"]
    assert rows(regimes)[CIOSL][1] == "–"

    other = rows(by_kind["other"][0])
    assert other == {"CIOSL (ours) / lambda1=0.5, n_replay=8": ["0.5000 ± 0.0100"]}


def test_figures_are_png_images(html_report):
    names = {Path(f.path).name for f in html_report.figures}
    assert names == {"accuracy_iid_digits-10-class.png", "accuracy_class_iid_digits-10-class.png",
                     "omega_vs_lambda2.png", "omega_vs_buffer.png", "regimes.png",
                     "matrix_iid_digits-10-class.png", "matrix_class_iid_digits-10-class.png"}
    for f in html_report.figures:
        assert f.png[:8] == b"\x89PNG\r\n\x1a\n"
        height, width, _ = matplotlib.image.imread(io.BytesIO(f.png)).shape
        assert height > 200 and width > 300
    # self-contained: nothing but the HTML file is written
    assert [p.name for p in Path(html_report.path).parent.iterdir()] == ["r.html"]


def test_markdown_report_and_cli(results, capsys, tmp_path):
    assert main(["report", str(results)]) == 0
    text = (results / "report.md").read_text()
    # one CIOSL row; its cells' letters differ (the prior's scale on iid only)
    line = next(x for x in text.splitlines() if x.startswith(f"| {CIOSL} |"))  # Table 2
    iid, cls = line.split(" | ")[1:3]
    assert iid.startswith("0.9000 ± 0.0100") and cls.startswith("**0.9500 ± 0.0100**")
    assert iid[len("0.9000 ± 0.0100"):] != cls[len("**0.9500 ± 0.0100**"):].rstrip(" |")
    assert "Not the paper's setting: a: max_grad_norm=1.0;" in text
    assert "| GDumb † | – | 0.9700 ± 0.0100 |" in text
    for link in [line[line.index("](") + 2:-1] for line in text.splitlines()
                 if line.startswith("![")]:
        assert (results / link).is_file(), link
    assert "| Method | iid · digits ≤10/class |" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no result JSONs" in capsys.readouterr().err


def test_html_report_holds_settings_versions_and_grids(html_report):
    html = Path(html_report.path).read_text()
    assert html.count("data:image/png;base64,") == len(html_report.figures)
    assert "&quot;lambda1&quot;: 0.5" in html  # the exact settings of each result
    assert f"torch {torch.__version__}" in html
    assert "<pre>name = &quot;demo&quot;\nmethods = [&quot;ncm&quot;]\n</pre>" in html


@pytest.mark.skipif((CHROMIUM is None or DRIVER is None) and not os.environ.get("CI"),
                    reason="needs chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; `make test` installs them as root); CI never skips")
def test_html_report_renders_in_headless_chromium(html_report):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        browser.get(Path(html_report.path).resolve().as_uri())
        assert browser.title.startswith("ciosl report")
        tables = browser.find_elements("css selector", "table.results")
        assert len(tables) == len(html_report.tables)
        assert all(t.size["height"] > 20 and t.size["width"] > 50 for t in tables)
        best = [td.text for td in browser.find_elements("css selector", "table.results td.best")]
        assert "0.9500 ± 0.0100" in best and "0.9700 ± 0.0100" not in best
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
            "i.getBoundingClientRect().width]);")
        assert len(images) == len(html_report.figures)
        assert all(done and natural > 0 and shown > 0 for done, natural, shown in images)
        assert browser.find_elements("css selector", "table.provenance tbody tr")
    finally:
        browser.quit()


def test_shipped_reference_report_matches_its_results(tmp_path):
    """docs/results/main-fashion/report.md is what `ciosl report` makes of the JSONs beside it
    (regenerate it after changing the report code)."""
    folder = Path(__file__).resolve().parents[2] / "docs" / "results" / "main-fashion"
    shipped = (folder / "report.md").read_text()
    report = write_report(folder, fmt="md", out=tmp_path / "report.md")
    assert len(report.entries) == len(list(folder.glob("*.json"))) >= 6 * 11
    for kind in ("main", "final", "cost", "forgetting", "bwt"):
        assert report.markdown(kind) in shipped, kind
    # every result ran with the current protocol: none is recomputed from its per-event curve
    assert not any(e.recomputed or e.legacy for e in report.entries)
    assert {e.method for e in report.entries} >= {"ciosl", "tinyer", "slda", "remind"}
    main_rows = [line.split(" | ")[0][2:] for line in report.markdown("main").splitlines()[2:]]
    assert main_rows.count(CIOSL) == 1  # one row; its departures are letters in its cells
    assert all(len(label) <= 60 for label in main_rows)
    main_table = next(t for t in report.tables if t.kind == "main")
    assert any("lambda1=30.0" in what for _, what in main_table.legend)
    # the shipped report links the legend's evidence to docs/findings.md and to the sections of
    # docs/findings/*.md that give it, each of which exists
    assert "Evidence: [docs/findings.md](../../findings.md)" in shipped
    links = re.findall(r"\]\(\.\./\.\./(findings/[\w.-]+#[\w-]+)\)", shipped)
    assert {target for _, target in EVIDENCE.values()} <= set(links)
    for target in set(links):
        assert _section_exists(folder.parent.parent, target), target


def _section_exists(docs: Path, target: str) -> bool:
    """Whether ``target`` (a file under docs/ and an anchor) names a heading of that file."""
    path, anchor = target.split("#")
    if not (docs / path).is_file():
        return False
    headings = [line.lstrip("#").strip() for line in (docs / path).read_text().splitlines()
                if line.startswith("#")]
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    return anchor in slugs


def test_every_departure_links_a_section_that_exists():
    """Each setting's evidence (``EVIDENCE``) is a heading of a file under docs/findings/."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for setting, (_, target) in EVIDENCE.items():
        assert target.startswith("findings/") and _section_exists(docs, target), setting
    assert not _section_exists(docs, "findings/kl-weight.md#no-such-section")


def test_the_offline_rows_do_not_depend_on_the_files_times(tmp_path):
    """Offline-hat and the final table's offline row take the reference most of a column's
    results share, not the newest file's: main-fashion's CIOSL cells, rerun after the offline
    cache was rebuilt, divide by a reference that differs in the last digits, and a fresh clone
    gives every file the same time."""
    src = Path(__file__).resolve().parents[2] / "docs" / "results" / "main-fashion"
    tables = []
    for newest in ("ciosl.json", "tinyer.json"):
        folder = tmp_path / newest
        folder.mkdir()
        for i, path in enumerate(sorted(src.glob("*.json"))):
            copy_ = folder / path.name
            shutil.copyfile(path, copy_)
            t = 2e9 if path.name.endswith(newest) else 1e9 + i
            os.utime(copy_, (t, t))
        report = write_report(folder, fmt="md", out=tmp_path / f"{newest}.md")
        tables.append([report.markdown(k).splitlines()[-1] for k in ("main", "final")])
    assert tables[0] == tables[1]
    assert tables[0][0].startswith("| Offline accuracy (Offline-hat) | 0.8729 |"), tables[0][0]


def row_labels(markdown: str) -> list[str]:
    """The first cell of every table row of a Markdown report (headers too), as a reader sees
    it: a link's text, without the backslashes of escaped characters."""
    labels = []
    for line in markdown.splitlines():
        if line.startswith("| "):
            cell = re.sub(r"^\[(.*)\]\([^)]*\)$", r"\1", line[2:].split(" | ")[0])
            labels.append(re.sub(r"\\(.)", r"\1", cell))
    return labels


def test_row_labels_are_at_most_60_characters_in_every_shipped_report():
    """Every row label the report writes for the shipped result folders, the file names of
    "Results used" included (issue 60: four were 61-83 characters), and in the shipped
    reports themselves (regenerated with `ciosl report DIR`)."""
    from ciosl.report.build import intro_lines, render_markdown
    from ciosl.report.results import drop_duplicates
    from ciosl.report.tables import build_tables

    docs = Path(__file__).resolve().parents[2] / "docs" / "results"
    shipped = sorted(docs.glob("*/report.md"))
    assert len(shipped) >= 3
    for path in shipped:
        assert [x for x in row_labels(path.read_text()) if len(x) > 60] == [], path
        entries, _ = drop_duplicates(load_entries(path.parent))
        text = render_markdown("t", build_tables(entries), [], entries, path.parent, path.parent,
                               intro_lines(entries, "after_base", [], path.parent))
        labels = row_labels(text)
        assert len(labels) > len(entries)  # every table's rows, and one row per result
        assert [x for x in labels if len(x) > 60] == [], path
    names = {p.name for p in (docs / "open-set").glob("*.json")}
    assert max(map(len, names)) > 80  # the long names are there, and shortened
    # the HTML report's provenance table: the short label, the whole name as its title
    from ciosl.report.html import provenance_html

    html = provenance_html(load_entries(docs / "open-set"), docs / "open-set")
    summaries = re.findall(r'<summary title="([^"]*)">([^<]*)</summary>', html)
    assert {full for full, _ in summaries} == names
    assert max(len(short) for _, short in summaries) == 60


def test_forgetting_table_heatmap_single_runs_and_older_results(template, tmp_path):
    """Forgetting / BWT come from each result; a result without them (an older ciosl) shows –;
    a single-run cell shows its value without a made-up ± 0."""
    fake(template, tmp_path, "ncm", "class_iid", 0.6)
    older = json.loads(fake(template, tmp_path, "slda", "class_iid", 0.7).read_text())
    for key in ("forgetting", "backward_transfer", "accuracy_matrix"):
        older.pop(key)
    for run in older["runs"]:
        for key in ("class_counts", "matrix_columns", "accuracy_matrix", "forgetting",
                    "backward_transfer", "final_class_accuracy"):
            run.pop(key, None)
    (tmp_path / "class_iid_slda.json").write_text(json.dumps(older))
    single = json.loads(fake(template, tmp_path, "tinyer", "class_iid", 0.9).read_text())
    single["runs"] = single["runs"][:1]
    (tmp_path / "class_iid_tinyer.json").write_text(json.dumps(summarise(single)))
    report = write_report(tmp_path, fmt="md", out=tmp_path / "out" / "report.md")
    forgetting = rows(next(t for t in report.tables if t.kind == "forgetting"))
    bwt = rows(next(t for t in report.tables if t.kind == "bwt"))
    table = {k: forgetting[k] + bwt[k] for k in forgetting}
    f, b = template["forgetting"], template["backward_transfer"]
    run = template["runs"][0]  # a real run's JSON holds the matrix: events x class steps
    assert len(run["accuracy_matrix"]) == len(run["events"]) == len(run["matrix_columns"])
    assert sorted(run["final_class_accuracy"]) == [str(c) for c in range(10)]
    assert table["NCM"] == [f"{f['mean']:.4f} ± {f['std']:.4f}", f"{b['mean']:.4f} ± {b['std']:.4f}"]
    assert table["Deep SLDA"] == ["–", "–"]
    assert table["TinyER"] == [f"{run['forgetting']:.4f}", f"{run['backward_transfer']:.4f}"]
    main = rows(next(t for t in report.tables if t.kind == "main"))
    assert "±" not in main["TinyER"][0] and "±" in main["NCM"][0]
    classes = rows(next(t for t in report.tables if t.kind == "classes"))
    per_class = [sum(r["final_class_accuracy"][str(c)] for r in template["runs"]) / 2
                 for c in range(10)]
    assert classes["NCM"] == [f"{100 * a:.1f}" for a in per_class]
    assert classes["Deep SLDA"] == ["–"] * 10  # that result predates per-class accuracies
    heatmap = [f for f in report.figures if f.title.startswith("Accuracy matrix")]
    assert len(heatmap) == 1 and heatmap[0].png[:4] == b"\x89PNG"
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Average forgetting" in text and "## Backward transfer (BWT)" in text
