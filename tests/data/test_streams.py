"""Stream-51 and CORe50 (data/streams.py) on small copies written in their real formats:
Stream-51's metadata JSON with [x_max, x_min, y_max, y_min] boxes and its novel test images;
CORe50's paths.pkl / LUP.pkl / labels.pkl (Python 2-style pickles) and s<session>/o<object>/
C_<ss>_<oo>_<fff>.png frames. Every frame's pixels say where it comes from, so a loader that
reads a box in another order, or takes another batch as the test set, gets other pixels."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ciosl.data.datasets import load_dataset
from ciosl.data.orderings import make_ordering
from ciosl.data.streams import (
    CORE50_TEST_SESSIONS,
    STREAM51_TEST,
    STREAM51_TRAIN,
    load_core50,
    load_stream51,
    official_ordering,
    stream51_box,
)
from helpers import cli

# ---------------------------------------------------------------- Stream-51

W, H = 80, 60


def _frame(tag: int) -> np.ndarray:
    """An RGB frame whose every pixel differs: x in red, y in green, the frame's tag in blue."""
    x, y = np.meshgrid(np.arange(W), np.arange(H))
    return np.stack([x * 3, y * 4, np.full_like(x, tag)], axis=-1).astype(np.uint8)


def _box(k: int) -> list[int]:
    """A box per frame, in Stream-51's order [x_max, x_min, y_max, y_min]."""
    x_min, y_min = 10 + k % 7, 5 + k % 5
    return [x_min + 30 + k % 3, x_min, y_min + 25 + k % 4, y_min]


VIDEOS = {0: [4, 3], 1: [5, 2], 2: [3, 3]}  # class -> frames of each of its videos
N_NOVEL = 3


def write_stream51(root: Path, *, order=lambda b: b) -> dict:
    """A Stream-51 folder: 3 classes of 2 videos each, 2 test frames per class, 3 novel test
    frames (class_id 3). Returns what was written."""
    train, test, k = [], [], 0
    for c, videos in VIDEOS.items():
        for v, n in enumerate(videos):
            for f in range(n):
                loc = f"train/{c}/{v:03d}/{f:05d}.png"
                (root / loc).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(_frame(k)).save(root / loc)
                train.append([c, v, v, f, order(_box(k)), loc])
                k += 1
    for c in [0, 0, 1, 1, 2, 2] + [3] * N_NOVEL:
        loc = f"test/{c}/{k:05d}.png"
        (root / loc).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_frame(k)).save(root / loc)
        test.append([c, order(_box(k)), loc])
        k += 1
    (root / STREAM51_TRAIN).write_text(json.dumps(train))
    (root / STREAM51_TEST).write_text(json.dumps(test))
    return {"train": train, "test": test}


def _expected_crop(k: int) -> np.ndarray:
    """The reference's crop, done by hand: box [x_max, x_min, y_max, y_min] grown 1.1x."""
    x_max, x_min, y_max, y_min = _box(k)
    cw, ch = x_max - x_min, y_max - y_min
    cx, cy = int(x_min + cw / 2), int(y_min + ch / 2)
    left, right = max(int(cx - cw * 0.55), 0), min(int(cx + cw * 0.55), W)
    top, bottom = max(int(cy - ch * 0.55), 0), min(int(cy + ch * 0.55), H)
    return _frame(k)[top:bottom, left:right]


def test_stream51_frames_are_their_boxes_grown_1_1x(tmp_path):
    written = write_stream51(tmp_path)
    raw = load_stream51(tmp_path)
    n = len(written["train"])
    crops = raw.train_x.get_batch(np.arange(n))
    for k in range(n):
        np.testing.assert_array_equal(crops[k], _expected_crop(k))
    assert crops[0].shape[:2] != (H, W)  # a crop, not the frame
    test = raw.test_x.get_batch(np.arange(len(written["test"])))
    np.testing.assert_array_equal(test[2], _expected_crop(n + 2))


@pytest.mark.parametrize(("bbox", "box"), [
    ([40, 10, 30, 5], (8, 3, 41, 30)),  # centre (25, 17): int(17 - 13.75) = 3
    ([80, 60, 60, 50], (59, 49, 80, 60)),  # clipped to the 80x60 frame
    ([21, 20, 11, 10], (19, 9, 20, 10)),  # one pixel: int() rounds towards zero
])
def test_stream51_box_is_the_reference_rounding(bbox, box):
    assert stream51_box(bbox, W, H) == box


@pytest.mark.parametrize(("name", "order", "message"), [
    ("x_min first", lambda b: [b[1], b[0], b[3], b[2]], "not \\[x_max, x_min, y_max, y_min\\]"),
    ("y swapped", lambda b: [b[0], b[1], b[3], b[2]], "not \\[x_max, x_min, y_max, y_min\\]"),
])
def test_stream51_boxes_in_another_order_are_refused_in_one_line(tmp_path, name, order,
                                                                 message):
    """A file whose boxes cannot be [x_max, x_min, y_max, y_min] is refused (a box in PIL's
    order may still pass as one: the pixel test above is what guards the reading)."""
    write_stream51(tmp_path, order=order)
    with pytest.raises(ValueError, match=message) as e:
        load_stream51(tmp_path)
    assert "\n" not in str(e.value) and STREAM51_TRAIN in str(e.value)


def test_stream51_videos_are_instances_and_its_instance_ordering_plays_them_whole(tmp_path):
    write_stream51(tmp_path)
    raw = load_stream51(tmp_path)
    sizes = [n for videos in VIDEOS.values() for n in videos]
    assert np.bincount(raw.train_instance).tolist() == sizes
    assert raw.train_frame.tolist() == [f for n in sizes for f in range(n)]
    from ciosl.data.datasets import get_spec

    spec = get_spec("stream51")
    assert spec.chunk is None
    for kind in ("instance", "class_instance"):
        o = make_ordering(kind, raw.train_y, seed=3, base_fraction=0.1,
                          classes_per_step=1, instances=raw.train_instance,
                          frames=raw.train_frame, chunk=spec.chunk)
        inst = raw.train_instance[o.stream]
        runs = [inst[0]] + [b for a, b in zip(inst, inst[1:], strict=False) if a != b]
        assert len(runs) == len(set(runs))  # each video once, contiguous
        for v in set(inst.tolist()):
            f = raw.train_frame[o.stream][inst == v]
            assert (np.diff(f) > 0).all()  # in temporal order (base init took some)


def test_stream51_novel_images_keep_their_label_and_are_only_novel(tmp_path, capsys):
    write_stream51(tmp_path)
    raw = load_dataset("stream51", root=tmp_path)
    assert raw.class_names == ("0", "1", "2", "novel")
    assert (raw.test_y == 3).sum() == N_NOVEL and raw.meta["n_novel_test"] == N_NOVEL
    rc, err = cli(capsys, ["run", "--dataset", "stream51", "--data", str(tmp_path),
                           "--extractor", "efficientnet_lite0@32", "--ordering", "iid",
                           "--method", "ncm", "--seeds", "0", "--no-offline", "--open-set",
                           "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
                           "--quiet"])
    assert rc == 0, err
    result = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    run = result["runs"][0]
    assert run["n_test"][-1] == 6  # the novel images are never scored for accuracy
    assert run["open_set"]["n_novel"][-1] == N_NOVEL  # but are novel when all is learned
    assert run["open_set"]["auroc"][-1] is not None


def test_stream51_missing_files_and_metadata_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="Stream-51_meta_train.json"):
        load_stream51(tmp_path)
    write_stream51(tmp_path)
    (tmp_path / "train/1/000/00002.png").unlink()
    with pytest.raises(FileNotFoundError, match="1 of the .* frames .* absent .*00002.png"):
        load_stream51(tmp_path)


# ---------------------------------------------------------------- CORe50

OBJECTS = (1, 2, 6, 7, 11, 12)  # 3 categories of 2 objects
FRAMES = 3


def _core50_frame(s: int, o: int, f: int) -> np.ndarray:
    img = np.zeros((16, 16, 3), np.uint8)
    img[..., 0], img[..., 1], img[..., 2] = s * 20, o * 4, f
    return img


def _decode(images) -> np.ndarray:
    """(session, object, frame) of each frame from its pixels."""
    return np.array([(im[0, 0, 0] // 20, im[0, 0, 1] // 4, im[0, 0, 2]) for im in images])


def write_core50(root: Path, *, test_sessions=CORE50_TEST_SESSIONS, folder=True) -> list[str]:
    """A CORe50 folder: frames of 11 sessions x 6 objects x 3 frames, paths.pkl in the
    official session-major order, LUP.pkl / labels.pkl with 3 runs of ni, nc and nic (Python 2
    pickles: protocol 2)."""
    frames = root / "core50_128x128" if folder else root
    paths = []
    for s in range(1, 12):
        for o in OBJECTS:
            for f in range(FRAMES):
                p = f"s{s}/o{o}/C_{s:02d}_{o:02d}_{f:03d}.png"
                (frames / p).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(_core50_frame(s, o, f)).save(frames / p)
                paths.append(p)
    sof = np.array([(int(p[1:].split("/")[0]), int(p.split("/o")[1].split("/")[0]),
                     int(p[-7:-4])) for p in paths])
    test = [i for i in range(len(paths)) if sof[i, 0] in test_sessions]
    train_sessions = [s for s in range(1, 12) if s not in CORE50_TEST_SESSIONS]
    lup, labels = {}, {}
    for scen in ("ni", "nc", "nic"):
        lup[scen], labels[scen] = [], []
        for run in range(3):
            rng = np.random.default_rng(run)
            if scen == "ni":  # one batch per training session, the sessions permuted
                groups = [[s] for s in rng.permutation(train_sessions)]
                batches = [[i for i in range(len(paths)) if sof[i, 0] == g[0]] for g in groups]
            elif scen == "nc":  # objects in pairs, every training session
                objs = rng.permutation(OBJECTS)
                batches = [[i for i in range(len(paths)) if sof[i, 1] in objs[j:j + 2]
                            and sof[i, 0] in train_sessions] for j in (0, 2, 4)]
            else:  # (object, session) videos in small batches
                vids = [(o, s) for o in OBJECTS for s in train_sessions]
                vids = [vids[j] for j in rng.permutation(len(vids))]
                batches = [[i for i in range(len(paths)) if (sof[i, 1], sof[i, 0]) in vids[j:j + 8]]
                           for j in range(0, len(vids), 8)]
            batches = [[int(i) for i in b] for b in batches] + [test]
            lup[scen].append(batches)
            labels[scen].append([[int(sof[i, 1] - 1) for i in b] for b in batches])
    for name, obj in (("paths.pkl", paths), ("LUP.pkl", lup), ("labels.pkl", labels)):
        (root / name).write_bytes(pickle.dumps(obj, protocol=2))
    return paths


@pytest.mark.parametrize("folder", [True, False], ids=["core50_128x128", "flat"])
def test_core50_test_set_is_sessions_3_7_10_and_train_the_others(tmp_path, folder):
    write_core50(tmp_path, folder=folder)
    raw = load_core50(tmp_path)
    te = _decode(raw.test_x.get_batch(np.arange(len(raw.test_y))))
    tr = _decode(raw.train_x.get_batch(np.arange(len(raw.train_y))))
    assert sorted(set(te[:, 0].tolist())) == [3, 7, 10]
    assert not set(tr[:, 0].tolist()) & {3, 7, 10} and len(set(tr[:, 0].tolist())) == 8
    assert len(raw.test_y) == 3 * len(OBJECTS) * FRAMES
    np.testing.assert_array_equal(raw.train_y, tr[:, 1] - 1)  # labels: the objects
    np.testing.assert_array_equal(raw.test_y, te[:, 1] - 1)
    np.testing.assert_array_equal(raw.train_frame, tr[:, 2])
    videos = {(s, o) for s, o, _ in tr}
    assert len(set(raw.train_instance.tolist())) == len(videos)  # an object in a session
    cat = load_core50(tmp_path, categories=True)
    np.testing.assert_array_equal(cat.train_y, (tr[:, 1] - 1) // 5)
    assert cat.class_names[0] == "plug adapter" and len(cat.class_names) == 10


def test_core50_a_test_batch_of_other_sessions_is_refused(tmp_path):
    write_core50(tmp_path, test_sessions=(2, 7, 10))
    with pytest.raises(ValueError, match=r"holds sessions \[2, 7, 10\]; CORe50's test set is "
                                         r"sessions \[3, 7, 10\]"):
        load_core50(tmp_path)


@pytest.mark.parametrize("scenario", ["ni", "nc", "nic"])
def test_core50_official_scenarios_follow_the_batches_of_the_run(tmp_path, scenario):
    write_core50(tmp_path)
    raw = load_core50(tmp_path)
    lup = pickle.loads((tmp_path / "LUP.pkl").read_bytes())
    paths = pickle.loads((tmp_path / "paths.pkl").read_bytes())
    for run in (0, 2):
        o = official_ordering(tmp_path, scenario, run)
        batches = lup[scenario][run][:-1]
        want = [_decode([_core50_frame(int(p[1:].split("/")[0]),
                                       int(p.split("/o")[1].split("/")[0]), int(p[-7:-4]))
                         for p in (paths[i] for i in b)]) for b in batches]
        got = _decode(raw.train_x.get_batch(o.stream))
        np.testing.assert_array_equal(got, np.concatenate(want[1:]))  # the listed order
        base = _decode(raw.train_x.get_batch(o.base))
        assert sorted(map(tuple, base.tolist())) == sorted(map(tuple, want[0].tolist()))
        assert o.events.tolist() == np.cumsum([0] + [len(b) for b in batches[1:]]).tolist()
        if scenario == "ni":
            assert o.event_classes is None
        else:
            seen = [set(np.concatenate(want[:t + 1])[:, 1] - 1) for t in range(len(batches))]
            assert [set(c) for c in o.event_classes] == seen


@pytest.mark.parametrize(("dataset", "ordering"), [
    ("core50", "nc"), ("core50", "ni"), ("core50-cat", "nic"), ("core50-cat", "class_instance")])
def test_core50_runs_through_the_cli_on_official_and_ciosl_orderings(tmp_path, capsys, dataset,
                                                                     ordering):
    write_core50(tmp_path)
    rc, err = cli(capsys, ["run", "--dataset", dataset, "--data", str(tmp_path),
                           "--extractor", "pixels", "--ordering", ordering, "--method",
                           "slda", "--seeds", "0,1", "--no-offline", "--open-set",
                           "--cache", str(tmp_path / "cache"), "--out",
                           str(tmp_path / "out"), "--quiet"])
    assert rc == 0, err
    result = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert result["final_accuracy"]["mean"] > 0.5  # the pixels tell the objects apart
    assert result["runs"][0]["n_test"][-1] == 3 * len(OBJECTS) * FRAMES
    if ordering in ("ni", "nc"):  # the official batches of run 0 and run 1
        lup = pickle.loads((tmp_path / "LUP.pkl").read_bytes())
        for run in result["runs"]:
            sizes = [len(b) for b in lup[ordering][run["seed"]][:-1]]
            assert run["n_base"] == sizes[0] and run["n_stream"] == sum(sizes[1:])


@pytest.mark.parametrize(("argv", "message"), [
    (["--dataset", "digits", "--ordering", "nc"],
     "dataset 'digits' does not support the 'nc' ordering"),
    (["--dataset", "core50", "--ordering", "ni", "--limit-per-class", "5"],
     "--limit-per-class cannot be used with CORe50's official 'ni' batches"),
])
def test_official_orderings_are_refused_where_they_do_not_apply(tmp_path, capsys, argv,
                                                                message):
    from helpers import one_line_error

    rc, err = cli(capsys, ["run", *argv, "--method", "ncm", "--data", str(tmp_path),
                           "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")])
    assert message in one_line_error(rc, err)
    assert not (tmp_path / "out").exists()


def test_ciosl_datasets_lists_both_with_where_to_get_them_and_finds_them(tmp_path, capsys,
                                                                        monkeypatch):
    from ciosl.cli import main

    monkeypatch.setenv("CIOSL_DATA", str(tmp_path))
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name, where in (("stream51", "tyler-hayes.github.io/stream51"),
                        ("core50", "vlomonaco.github.io/core50"),
                        ("core50-cat", "vlomonaco.github.io/core50")):
        line = next(x for x in out.splitlines() if x.startswith(f"{name}: present"))
        assert "present no" in line
        assert where in " ".join(out.split())  # its how-to-get line names the source
    write_stream51(tmp_path / "stream51")
    write_core50(tmp_path / "core50")
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("stream51", "core50", "core50-cat"):
        assert f"{name}: present yes" in out
