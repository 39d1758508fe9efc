"""Raw frames, the extractor's flags and the folder's pin, on a real ``ciosl serve`` (issue 56):
uint8 frames as ``.npy`` or raw bytes give the answers of the same images as PNG and of the
extractor called in-process; bad frames are refused in one line with nothing learned; a batch
that fails in the network is a 503 that learns nothing; a restart with another extractor is
refused."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from server_helpers import TOKEN, Server

BACKBONE = (
    "import torch\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.conv = torch.nn.Conv2d(3, 6, 3)\n"
    "    def forward(self, x):\n"
    "        if bool((x > 2.2).all(dim=(1, 2, 3)).any()):  # an all-white frame in the batch\n"
    "            raise RuntimeError('CUDA out of memory (simulated)')\n"
    "        return torch.relu(self.conv(x))\n"
    "def make():\n"
    "    return Net(), {'size': 16}\n"
    "def make_slow():\n"
    "    import time\n"
    "    import numpy as np\n"
    "    torch.manual_seed(0)\n"
    "    def prepare(images):\n"
    "        a = images if isinstance(images, np.ndarray) else np.stack(images)\n"
    "        if not a.any():  # an all-black request: prepared once the test says so\n"
    "            import os, pathlib\n"
    "            pathlib.Path(os.environ['G_MARK']).touch()\n"
    "            for _ in range(600):\n"
    "                if pathlib.Path(os.environ['G_RELEASE']).exists():\n"
    "                    break\n"
    "                time.sleep(0.05)\n"
    "        x = torch.from_numpy(np.ascontiguousarray(a)).float().permute(0, 3, 1, 2)\n"
    "        return torch.nn.functional.interpolate(x / 255, size=(16, 16))\n"
    "    return torch.nn.Conv2d(3, 4, 3), prepare\n"
    "def make_other():\n"
    "    torch.manual_seed(1)\n"
    "    return torch.nn.Conv2d(3, 6, 3), {'size': 16}\n")
EXTRACTOR = "module:g_backbone:make"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("backbone")
    (folder / "g_backbone.py").write_text(BACKBONE)
    return {"PYTHONPATH": f"{folder}:{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, env):
    with Server(tmp_path_factory.mktemp("frames") / "srv", "--method", "ncm", "--extractor",
                EXTRACTOR, "--max-pixels", "1000000", env=env) as s:
        yield s


def _frames(n, seed=0, side=20):
    return np.random.default_rng(seed).integers(0, 200, (n, side, side, 3), np.uint8)


def _png(frame) -> str:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _raw(frames, labels=None, shape=None):
    headers = {"Content-Type": "application/octet-stream",
               "X-Ciosl-Shape": shape or ",".join(map(str, frames.shape))}
    if labels is not None:
        headers["X-Ciosl-Labels"] = json.dumps(labels)
    return {"content": frames.tobytes(), "headers": headers}


def test_frames_as_npy_raw_bytes_and_png_answer_alike_and_as_in_process(server, env,
                                                                         monkeypatch):
    c = server.client()
    fr = _frames(6)
    assert c.learn_images(fr, [0, 1, 2, 0, 1, 2])["learned"] == 6
    with server.http() as h:
        r = h.post("/v1/learn", **_raw(_frames(3, seed=1), [2, 1, 0]))
        assert r.status_code == 200 and r.json()["seen"] == 9, r.text
        by_raw = h.post("/v1/predict", **_raw(fr)).json()
        by_png = h.post("/v1/predict", json={"images": [_png(f) for f in fr]}).json()
    by_npy = c.predict_images(fr)
    for other in (by_raw, by_png):  # equal up to float rounding (batches differ in size)
        np.testing.assert_allclose(by_npy["proba"], other["proba"], atol=1e-6)
        assert by_npy["label"] == other["label"]
    assert by_npy["seq"] == 2 and len(by_npy["prediction_id"]) == 6
    # the extractor called in-process, on the same path, gives the features the server used
    monkeypatch.syspath_prepend(env["PYTHONPATH"].split(":")[0])
    from ciosl.data.extraction import open_extractor
    from ciosl.data.features import execution

    z = open_extractor(EXTRACTOR, how=execution("cpu", "torch"))(fr)
    assert z.shape == (6, 6)
    np.testing.assert_allclose(c.predict_proba(z), np.asarray(by_npy["proba"]), atol=1e-6)


@pytest.mark.parametrize("case, status, message", [
    ("float frames", 400, "frames: dtype float32, frames are uint8 (n, h, w, 3)"),
    ("four channels", 400, "frames: shape (2, 20, 20, 4), frames are (n, h, w, 3)"),
    ("shape header disagrees", 400, "body: 2400 bytes, X-Ciosl-Shape 2,20,21,3 needs 2520"),
    ("shape header of 2 channels", 400, "X-Ciosl-Shape: 2,20,20,2: frames are n,h,w,3"),
    ("too many pixels", 413, "frames: 3000000 pixels, at most 1000000 per request"),
    ("not an image", 400, "images[0]: not a PNG, JPEG or WebP image"),
    ("white frame: the network fails", 503, "the batch holding this request failed "
     "(RuntimeError: CUDA out of memory (simulated)); nothing of it was learned"),
])
def test_bad_frames_are_refused_in_one_line_and_nothing_is_learned(server, case, status,
                                                                   message):
    fr = _frames(2)
    with server.http() as h:
        before = h.get("/v1/state").json()
        npy = io.BytesIO()
        if case == "float frames":
            np.save(npy, fr.astype(np.float32))
        elif case == "four channels":
            np.save(npy, np.concatenate([fr, fr[..., :1]], axis=3))
        elif case == "too many pixels":
            np.save(npy, np.zeros((3, 1000, 1000, 3), np.uint8))
        if npy.tell():
            labels = "[0, 1, 2]" if case == "too many pixels" else "[0, 1]"
            r = h.post("/v1/learn", content=npy.getvalue(), headers={
                "Content-Type": "application/x-npy", "X-Ciosl-Labels": labels})
        elif case == "shape header disagrees":
            r = h.post("/v1/learn", **_raw(fr, [0, 1], shape="2,20,21,3"))
        elif case == "shape header of 2 channels":
            r = h.post("/v1/learn", **_raw(fr, [0, 1], shape="2,20,20,2"))
        elif case == "not an image":
            r = h.post("/v1/learn", json={"images": [base64.b64encode(b"GIF89a..").decode()],
                                          "y": [0]})
        else:  # a white frame: the module raises on the batch that holds it
            white = np.full((1, 20, 20, 3), 255, np.uint8)
            r = h.post("/v1/learn", **_raw(np.concatenate([fr[:1], white]), [0, 1]))
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert message in error and "\n" not in error
        after = h.get("/v1/state").json()
    assert (after["seen"], after["seq"], after["digest"]) == (
        before["seen"], before["seq"], before["digest"])


def test_frames_need_an_extractor(tmp_path):
    with Server(tmp_path / "srv", "--method", "ncm") as s, s.http() as h:
        r = h.post("/v1/learn", **_raw(_frames(1), [0]))
        assert r.status_code == 400
        assert r.json()["error"].startswith("frames: this server has no extractor")


def test_the_folder_pins_its_extractor(tmp_path, env):
    folder = tmp_path / "srv"
    with Server(folder, "--method", "ncm", "--extractor", EXTRACTOR, env=env) as s:
        s.client().learn_images(_frames(2), [0, 1])
        s.stop()
    pin = json.loads((folder / "extractor.json").read_text())
    assert pin["extractor"] == EXTRACTOR and pin["size"] == 16
    assert pin["backend"] == "torch" and pin["device"] == "cpu" and len(pin["weights"]) >= 32
    with Server(folder, "--extractor", EXTRACTOR, env=env) as s:  # the same: served
        assert s.client().state()["seen"] == 2
        s.stop()
    err = _refused("--dir", str(folder), "--extractor", "module:g_backbone:make_other",
                   env=env)
    assert err == (
        f"error: --dir {folder} holds features of extractor {EXTRACTOR} (size 16, torch on "
        "cpu); this start's --extractor is module:g_backbone:make_other, not "
        f"{EXTRACTOR}: start it with the same extractor, or use another --dir")
    assert json.loads((folder / "extractor.json").read_text()) == pin


@pytest.mark.parametrize("args, message", [
    (["--extractor", EXTRACTOR, "--device", "gpu"], "--device 'gpu': expected one of auto, "
     "cpu, cuda"),
    (["--extractor", EXTRACTOR, "--backend", "tensorrt"], "--backend 'tensorrt': expected one "
     "of auto, onnxruntime, torch"),
    (["--extractor", EXTRACTOR, "--batch-images", "0"], "--batch-images must be in 1..4096"),
    (["--extractor", EXTRACTOR, "--batch-wait-ms", "-1"], "--batch-wait-ms must be in 0..1000"),
    (["--device", "cpu"], "--device: sets where the images' extractor runs; give --extractor"),
])
def test_the_extractors_flags_are_checked_in_one_line(tmp_path, env, args, message):
    err = _refused("--dir", str(tmp_path / "srv"), "--method", "ncm", *args, env=env)
    assert message in err, err
    assert not (tmp_path / "srv").exists()  # refused before the folder is touched


def _refused(*args, env) -> str:
    """The one line a refused ``ciosl serve`` prints (no traceback)."""
    r = subprocess.run([sys.executable, "-m", "ciosl", "serve", "--port", "0", *args],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CIOSL_TOKEN": TOKEN, **env})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


def test_a_learn_with_check_parses_and_checks_and_learns_nothing(server):
    with server.http() as h:
        before = h.get("/v1/state").json()
        r = h.post("/v1/learn?check=1", **_raw(_frames(2, seed=5), [7, 8]))
        assert r.json() == {"checked": 2, "learned": 0}
        bad = h.post("/v1/learn?check=1", **_raw(_frames(2), [7, 8], shape="2,20,21,3"))
        assert bad.status_code == 400 and bad.json()["error"].startswith("body: 2400 bytes")
        after = h.get("/v1/state").json()
    assert after == before  # nothing learned, nothing logged, no new class


def test_learns_reach_the_writer_in_the_order_their_bodies_arrived(tmp_path, env):
    """A learn whose images are slow to prepare (held until the test releases them), then one
    sent after it that is quick: the quick one waits its turn (its record follows the slow
    one's), and a prediction meanwhile does not wait."""
    import threading
    import time

    mark, release = tmp_path / "mark", tmp_path / "release"
    env = {**env, "G_MARK": str(mark), "G_RELEASE": str(release)}
    with Server(tmp_path / "srv", "--method", "ncm", "--extractor", "module:g_backbone:make_slow",
                env=env) as s, s.http() as h:
        assert h.post("/v1/learn", **_raw(_frames(2, seed=3), [0, 1])).status_code == 200
        answers = {}

        def send(name, frames, label):
            with s.http() as hh:
                answers[name] = hh.post("/v1/learn", **_raw(frames, [label])).json()
        slow = threading.Thread(target=send, args=("slow", np.zeros((1, 20, 20, 3), np.uint8),
                                                   0))
        slow.start()
        for _ in range(1200):  # hang guard: 60 s
            if mark.exists():
                break
            time.sleep(0.05)
        assert mark.exists()  # the slow learn's body is in, its images held
        quick = threading.Thread(target=send, args=("quick", _frames(1, seed=4), 1))
        quick.start()
        asked = h.post("/v1/predict", **_raw(_frames(1, seed=5)))
        assert asked.status_code == 200 and "slow" not in answers  # answered meanwhile
        time.sleep(1.0)  # room for the quick learn to overtake, were it allowed to
        release.touch()
        slow.join(60)
        quick.join(60)
    assert answers["slow"]["seq"] == 2 and answers["quick"]["seq"] == 3, answers
