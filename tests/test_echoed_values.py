"""Every value an error echoes is shortened, wherever it is echoed: a 100,000-character
``--set`` value or grid value made a 100 kB error line; a 5,000-digit integer was refused as
"expects int" (Python's int() reads at most 4300 digits); a grid starting with a UTF-8
byte-order mark was "Invalid statement (at line 1, column 1)"; the river adapter called
``np.longdouble('1e4000')`` "not a real number". Each row: the input, and what the one line
must say.
"""

from __future__ import annotations

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.cli import main
from ciosl.errors import LINE_MAX, clip_line, echo
from ciosl.river import RiverClassifier

LONG = "x" * 100_000
DIGITS = "9" * 5000
RUN = ["run", "--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "5",
       "--quiet"]

# (flags after RUN, what the line says): each refused before any work, in one short line
FLAGS = [
    (["--method", "tinyer", "--set", f"lr={LONG}"],
     "setting 'lr' expects float, got 'xxxx"),
    (["--method", "tinyer", "--set", f"{LONG}=1"], "unknown setting(s) xxxx"),
    (["--method", "tinyer", "--set", f"buffer={DIGITS}"],
     "setting 'buffer' expects an integer <= 1000000, got one of 5,000 digits"),
    (["--method", "tinyer", "--set", f"buffer=-{DIGITS}"],
     "setting 'buffer' expects an integer <= 1000000, got a negative one of 5,000 digits"),
    (["--method", "tinyer", "--set", f"lr={DIGITS}"],
     "(5,002 characters): too large for a float (it reads as inf)"),
    (["--method", LONG], "unknown method 'xxxx"),
    (["--method", "ncm", "--seeds", DIGITS], "--seeds expects integers like 0,1,2, got '9999"),
    (["--method", "ncm", "--limit-per-class", DIGITS], "argument --limit-per-class"),
    (["--method", "ncm", "--dataset", f"features:{LONG}"], "features:xxxx"),
]


@pytest.mark.parametrize("flags,says", FLAGS, ids=lambda v: v[:40] if isinstance(v, str)
                         else " ".join(f[:20] for f in v))
def test_a_huge_value_on_the_command_line_is_echoed_short(tmp_path, capsys, flags, says):
    try:
        rc = main([*RUN, "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c"), *flags])
    except SystemExit as e:  # a usage error: argparse ends the program
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err[:2000]
    assert len(lines[0]) < 400, lines[0][:2000]
    assert says in lines[0]
    assert not (tmp_path / "out").exists()


def grid(tmp, body: str, prefix: str = "") -> str:
    path = tmp / "g.toml"
    path.write_text(prefix + f'name = "g"\nmethods = ["tinyer"]\ndatasets = ["digits"]\n'
                    f'orderings = ["class_iid"]\n{body}\n', encoding="utf-8")
    return str(path)


# (grid body, what the line says)
GRIDS = [
    (f'[grid.tinyer]\nlr = ["{LONG}"]', "grid.tinyer.lr: expects a number, got string 'xxxx"),
    (f'[settings.tinyer]\nlr = "{LONG}"', "settings.tinyer.lr: expects a number, got string"),
    (f'[settings.tinyer]\nbuffer = {DIGITS}', "it holds an integer of more digits than Python "
                                              "reads (no setting takes one)"),
    (f'[settings.tinyer]\nbuffer = {"9" * 40}', "settings.tinyer.buffer: expects a number of "
                                                f"at most 30 digits, got {'9' * 40}"),
    (f'[grid.tinyer]\nbuffer = [{"9" * 100}]', "grid.tinyer.buffer: expects a number of at "
                                               "most 30 digits, got 1e+100 (an int)"),
    (f'[variants.tinyer.{"v" * 1000}]\nlr = "{LONG}"', "expects a number, got string 'xxxx"),
]


@pytest.mark.parametrize("body,says", GRIDS, ids=lambda v: v[:30])
def test_a_huge_value_in_a_grid_is_echoed_short(tmp_path, capsys, body, says):
    rc = main(["sweep", grid(tmp_path, body), "--dry-run", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err[:2000]
    assert len(lines[0]) < 1200 and says in lines[0], lines[0][:2000]


def test_a_grid_starting_with_a_byte_order_mark_is_read(tmp_path, capsys):
    path = grid(tmp_path, "", prefix="\ufeff")
    assert main(["sweep", path, "--dry-run", "--out", str(tmp_path / "out")]) == 0, \
        capsys.readouterr().err
    assert "g: 1 cells" in capsys.readouterr().out


# library: (call, exception, what the message says) -- each message shorter than 300
LIBRARY = [
    (lambda: make_learner("tinyer", lr=LONG), ValueError,
     "setting 'lr' expects a number, got lr='xxxx"),
    (lambda: make_learner("tinyer", buffer=10**5000), ValueError,
     "setting 'buffer' must be <= 1000000, got buffer=1e+5000 (an int)"),
    (lambda: make_learner("ncm").learn_one([1.0], 1.5 + 0 * len(LONG)), TypeError,
     "labels must be integers or strings, got float 1.5"),
    (lambda: make_learner("ncm").learn_one([1.0], [LONG.encode()]), TypeError,
     "labels must be integers or strings, got bytes b'xxxx"),
    (lambda: RiverClassifier(make_learner("ncm")).learn_one({"a": np.longdouble("1e4000")}, 1),
     ValueError, "feature 'a' = 1e+4000 (a longdouble) is too large"),
    (lambda: RiverClassifier(make_learner("ncm")).learn_one({LONG: LONG}, 1), TypeError,
     "feature 'xxxx"),
]


@pytest.mark.parametrize("call,kind,says", LIBRARY, ids=lambda v: getattr(v, "__name__", v)
                         if not isinstance(v, str) else v[:40])
def test_the_library_echoes_values_short(call, kind, says):
    with pytest.raises(kind) as refused:
        call()
    assert says in str(refused.value) and len(str(refused.value)) < 300, str(refused.value)[:500]


def test_the_river_adapter_still_takes_a_longdouble_in_range():
    model = RiverClassifier(make_learner("ncm"))
    model.learn_one({"a": np.longdouble("2.5")}, 1)
    assert model.predict_one({"a": 2.5}) == 1


# the helpers themselves: (value, what echo shows)
ECHOES = [(LONG, "'" + "x" * 79 + "... (100,002 characters)"), (10**5000, "1e+5000 (an int)"),
          (-(10**90), "-1e+90 (an int)"), (10**40 - 1, "9" * 40),
          (10**100 - 1, "1e+100 (an int)"), (12345, "12345"), ("short", "'short'"),
          ([10**5000], "<list>")]


@pytest.mark.parametrize("value,shown", ECHOES, ids=lambda v: str(type(v).__name__))
def test_echo(value, shown):
    assert echo(value) == shown


def test_clip_line_keeps_a_line_short_with_its_start_and_end():
    line = clip_line("error: start " + " ".join(["word"] * 50_000) + " advice at the end")
    assert len(line) < LINE_MAX + 100
    assert line.startswith("error: start") and line.endswith("advice at the end")
    assert clip_line("a " + "y" * 5000 + " b") == "a " + "y" * 80 + "... (5,000 characters) b"
