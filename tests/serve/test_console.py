"""The console at ``/`` in a real headless Chromium (Selenium + chromedriver) against a real
``ciosl serve`` on 127.0.0.1: sign in, create a learner, teach from Chromium's fake camera and
from files, ask, correct, watch the events stream update the page, labels shown as text, the
Content-Security-Policy, screenshots, a phone's width. One browser and one server for the module:
the tests run in order, each on the state the ones before left (a teacher's session)."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import Server

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "src" / "ciosl" / "serve" / "console"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "media-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'")
XSS = "<img src=x onerror=alert(1)>"
WAIT = 60  # seconds: a hang guard for every wait on the page, never a timing assertion


def _missing() -> str | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if chromium is None or driver is None:
        what = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver))
                            if p is None)
        return (f"{what} not found (apt-get install chromium chromium-driver; `make data` "
                "does it as root)")
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        pytest.fail(f"the console's browser tests cannot run: {missing}", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                "--window-size=1100,900", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(shutil.which("chromedriver")),
                              options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console") / "srv"
    # at 64 pixels a side the fake camera's frames are told from the files every time (at 32,
    # about 1 frame in 20 was taken for red noise)
    with Server(folder, "--method", "ncm", "--extractor", "efficientnet_lite0@64",
                "--max-pixels", "1000000") as s:  # a phone's photo is sent scaled down
        yield s


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, list[Path]]:
    """Small PNGs of two kinds the camera never shows: red noise and blue stripes."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    out: dict[str, list[Path]] = {"red": [], "blue": [], "big": [folder / "big-red.png"]}
    big = rng.integers(0, 60, size=(1200, 1600, 3), dtype=np.uint8)  # 1.9 megapixels
    big[..., 0] = 220
    Image.fromarray(big).save(out["big"][0])
    for i in range(3):
        red = rng.integers(0, 60, size=(48, 48, 3), dtype=np.uint8)
        red[..., 0] = rng.integers(180, 255, size=(48, 48))
        blue = np.zeros((48, 48, 3), np.uint8)
        blue[:, ::4 + i, 2] = 255
        blue[::3, :, 1] = 90
        for kind, a in (("red", red), ("blue", blue)):
            path = folder / f"{kind}-{i}.png"
            Image.fromarray(a).save(path)
            out[kind].append(path)
    return out


# ---------------------------------------------------------------------- helpers
def wait(driver, condition, what: str):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:  # an element redrawn under the condition is looked up again
        return WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(
            StaleElementReferenceException,)).until(lambda d: condition(d))
    except TimeoutException:
        raise AssertionError(f"{what}: not within {WAIT} s; page says: "
                             f"{_errors(driver)!r}") from None


def _errors(driver) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", ".error") if e.text]


def by_id(driver, id_: str):
    return driver.find_element("id", id_)


def text(driver, id_: str) -> str:
    return by_id(driver, id_).text


def table(driver, id_: str) -> list[str]:
    """The row headers of a table (names, labels)."""
    return [r.text for r in driver.find_elements("css selector", f"#{id_} tbody th")]


def go(driver, view: str) -> None:
    driver.find_element("css selector", f"#nav [data-view={view}]").click()
    wait(driver, lambda d: by_id(d, f"view-{view}").is_displayed(), f"the {view} view")


def typed(driver, id_: str, value: str) -> None:
    box = by_id(driver, id_)
    box.clear()
    box.send_keys(value)


def api(server) -> httpx.Client:
    return server.http()


def learner(server, name: str) -> dict:
    with api(server) as h:
        r = h.get(f"/v1/learners/{name}")
        assert r.status_code == 200, r.text
        return r.json()


def distinct_colours(png: bytes) -> int:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    return len(img.getcolors(maxcolors=1 << 20) or [])


def severe_logs(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


# ---------------------------------------------------------------------- the files
def test_the_page_and_its_files_carry_the_csp_and_no_inline_code(server):
    with httpx.Client(base_url=server.url, timeout=30) as h:  # no token: the files hold no data
        page = h.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for name in ("console.js", "api.js", "charts.js", "media.js", "console.css"):
            r = h.get(f"/console/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-content-type-options"] == "nosniff"
            kind = "text/css" if name.endswith(".css") else "text/javascript"
            assert r.headers["content-type"].startswith(kind), name
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        missing = h.get("/console/../app.py")
        assert missing.status_code == 404
        assert h.get("/console/nothing.js").json()["error"] == "no console file 'nothing.js'"
    html = page.text
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline script"
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", html), "inline style or handler"
    scripts = re.findall(r'src="(/console/[^"]+)"', html)
    assert scripts == ["/console/console.js"]
    scripts = sorted(CONSOLE.glob("*.js"))
    assert len(scripts) >= 4
    for js in scripts:  # data reaches the page as text only
        code = js.read_text()
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(",
                             code), js.name


# ---------------------------------------------------------------------- sign in
def test_a_wrong_token_says_so_in_one_line_and_the_right_one_signs_in(browser, server):
    browser.get(server.url + "/")
    wait(browser, lambda d: by_id(d, "view-signin").is_displayed(), "the sign-in view")
    typed(browser, "token", "not-the-token")
    browser.find_element("css selector", "#signin-form button[type=submit]").click()
    wait(browser, lambda d: text(d, "signin-error"), "the wrong token's line")
    line = text(browser, "signin-error")
    assert line.startswith("Wrong token") and "401" in line and "\n" not in line
    assert not by_id(browser, "nav").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('ciosl-token')") is None

    typed(browser, "token", server.token)
    browser.find_element("css selector", "#signin-form button[type=submit]").click()
    wait(browser, lambda d: by_id(d, "view-learners").is_displayed(), "the learners view")
    assert browser.execute_script("return sessionStorage.getItem('ciosl-token')") == server.token
    assert server.token not in browser.current_url
    wait(browser, lambda d: table(d, "learners-table") == ["default"], "the learners table")
    assert text(browser, "signin-error") == ""


def test_create_a_learner_from_the_methods_and_their_settings(browser, server):
    go(browser, "learners")
    options = wait(browser, lambda d: d.find_elements("css selector", "#create-method option"),
                   "the methods")
    names = [o.get_attribute("value") for o in options]
    assert {"ncm", "slda", "ciosl"} <= set(names)
    from selenium.webdriver.support.ui import Select

    Select(by_id(browser, "create-method")).select_by_value("ncm")
    temperature = wait(browser, lambda d: d.find_elements("id", "setting-temperature"),
                       "ncm's settings")[0]
    assert temperature.get_attribute("value") == "1.0"
    assert "softmax temperature" in text(browser, "setting-temperature-help")
    # the server's refusal is shown as its one line
    typed(browser, "create-name", ".hidden")
    browser.find_element("css selector", "#create-form button[type=submit]").click()
    wait(browser, lambda d: text(d, "create-error"), "the bad name's line")
    assert "400" in text(browser, "create-error") and "\n" not in text(browser, "create-error")

    typed(browser, "create-name", "shop")
    typed(browser, "setting-temperature", "0.5")  # a setting changed from its default
    browser.find_element("css selector", "#create-form button[type=submit]").click()
    wait(browser, lambda d: "Created shop" in text(d, "create-status"), "the new learner")
    wait(browser, lambda d: table(d, "learners-table") == ["default", "shop"],
         "shop in the table")
    made = learner(server, "shop")
    assert made["method"] == "ncm" and made["settings"]["temperature"] == 0.5


# ---------------------------------------------------------------------- teach, ask, correct
def test_teach_two_classes_from_the_fake_camera_and_from_files(browser, server, pictures):
    go(browser, "teach")
    assert by_id(browser, "teach-noextractor").is_displayed() is False
    assert browser.find_element("css selector", "#view-teach .learner-name").text == "shop"
    typed(browser, "teach-label", "camera")
    browser.find_element("css selector", "#teach-camera .camera-start").click()
    wait(browser, lambda d: by_id(d, "teach-burst").is_enabled(), "the camera")
    typed(browser, "burst-n", "8")  # the fake camera's animation, spread over 2 s
    typed(browser, "burst-s", "2")
    by_id(browser, "teach-burst").click()
    wait(browser, lambda d: "Learned 8" in text(d, "teach-status"), "the burst's answer")
    by_id(browser, "teach-one").click()
    wait(browser, lambda d: "Learned 1" in text(d, "teach-status"), "one frame's answer")

    typed(browser, "teach-label", "red")
    by_id(browser, "teach-files").send_keys("\n".join(str(p) for p in pictures["red"]))
    wait(browser, lambda d: "Learned 3" in text(d, "teach-status"), "the files' answer")
    assert "seen 12" in text(browser, "teach-status")
    sent = browser.find_elements("css selector", "#teach-sent figure")
    assert len(sent) == 3 and len(sent[0].find_elements("tag name", "img")) == 3
    shown = learner(server, "shop")
    assert shown["seen"] == 12 and sorted(shown["classes_list"]) == ["camera", "red"]

    # 1600 x 1200: over the server's --max-pixels as it is, sent at 640 x 480
    by_id(browser, "teach-files").send_keys(str(pictures["big"][0]))
    wait(browser, lambda d: "Learned 1" in text(d, "teach-status"), "the big file's answer")
    caption = browser.find_element("css selector", "#teach-sent figure img")
    assert caption.get_attribute("alt") == "red: big-red.png (640 x 480)"
    assert learner(server, "shop")["seen"] == 13

    by_id(browser, "teach-label").clear()
    by_id(browser, "teach-one").click()
    wait(browser, lambda d: text(d, "teach-error"), "the missing label's line")
    assert text(browser, "teach-error").startswith("Label:")
    assert learner(server, "shop")["seen"] == 13


def _ask_file(browser, path: Path) -> object:
    before = len(browser.find_elements("css selector", "#answers .answer"))
    by_id(browser, "ask-files").send_keys(str(path))
    wait(browser, lambda d: len(d.find_elements("css selector", "#answers .answer")) > before,
         f"the answer about {path.name}")
    return browser.find_elements("css selector", "#answers .answer")[0]


def test_ask_answers_with_the_learned_classes_and_a_correction_changes_the_accuracy(
        browser, server, pictures):
    browser.execute_script("window.notReloaded = 1;")
    go(browser, "ask")
    browser.find_element("css selector", "#ask-camera .camera-start").click()
    wait(browser, lambda d: by_id(d, "ask-frame").is_enabled(), "the ask camera")
    by_id(browser, "ask-frame").click()
    card = wait(browser, lambda d: d.find_elements("css selector", "#answers .answer"),
                "the camera frame's answer")[0]
    labels = [e.text for e in card.find_elements("css selector", ".top .answer-label")]
    assert sorted(labels) == ["camera", "red"]
    assert labels[0] == "camera"  # the fake camera's pattern, taught above
    assert card.find_element("css selector", ".verdict strong").text == "camera"
    card.find_element("css selector", ".confirm").click()
    wait(browser, lambda d: card.find_element("css selector", ".feedback-result").text,
         "the confirmation")
    assert "the answer was right" in card.find_element("css selector", ".feedback-result").text
    assert not card.find_element("css selector", ".confirm").is_enabled()  # once per answer

    go(browser, "watch")
    wait(browser, lambda d: text(d, "acc-now") == "100.0%", "the accuracy after a right answer")

    go(browser, "ask")
    card = _ask_file(browser, pictures["red"][0])
    assert card.find_element("css selector", ".verdict strong").text == "red"
    fix = card.find_element("css selector", ".fix-label")
    fix.send_keys("blue")  # the teacher says it is something else: a wrong answer
    card.find_element("css selector", ".correct").click()
    wait(browser, lambda d: card.find_element("css selector", ".feedback-result").text,
         "the correction")
    assert "the answer was wrong" in card.find_element("css selector", ".feedback-result").text

    go(browser, "watch")
    wait(browser, lambda d: text(d, "acc-now") == "50.0%", "the accuracy after a correction")
    with api(server) as h:
        metrics = h.get("/v1/learners/shop/metrics").json()
    assert metrics["feedback"] == 2 and metrics["accuracy"] == 0.5
    assert "blue" in metrics["classes"]
    assert browser.execute_script("return window.notReloaded") == 1


def test_the_events_stream_updates_the_page_without_a_reload(browser, server, pictures):
    go(browser, "watch")
    browser.execute_script("window.notReloaded = 2;")
    seen_before = learner(server, "shop")["seen"]
    listed = len(browser.find_elements("css selector", "#events li"))
    assert listed >= 4  # the learns, classes and feedback so far
    # the network comes back: the page reads the stream again from the last event it saw (a
    # reconnection without Last-Event-ID would be sent every kept event again: duplicates)
    browser.execute_script("window.dispatchEvent(new Event('online'));")
    wait(browser, lambda d: "reconnected after event" in text(d, "stream-status"),
         "the reconnection")
    image = base64.b64encode(pictures["blue"][1].read_bytes()).decode()
    with api(server) as h:  # taught by someone else: only the events stream can tell the page
        r = h.post("/v1/learners/shop/learn", json={"images": [image], "y": ["from-the-api"]})
        assert r.status_code == 200, r.text
    wait(browser, lambda d: any("from-the-api" in e.text for e in d.find_elements(
        "css selector", "#events li[data-event=class]")), "the new class event")
    wait(browser, lambda d: any(f"seen {seen_before + 1}" in e.text for e in d.find_elements(
        "css selector", "#events li[data-event=learn]")), "the learn event")
    wait(browser, lambda d: "from-the-api" in table(d, "classes-table"),
         "the class in the table")
    ids = [int(e.get_attribute("data-id")) for e in browser.find_elements(
        "css selector", "#events li")]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert len(ids) == listed + 2  # this learn and its new class, nothing again
    assert browser.execute_script("return window.notReloaded") == 2


def test_a_label_with_markup_is_shown_as_text(browser, server, pictures):
    from selenium.common.exceptions import NoAlertPresentException

    go(browser, "teach")
    typed(browser, "teach-label", XSS)
    by_id(browser, "teach-files").send_keys("\n".join(str(p) for p in pictures["blue"]))
    wait(browser, lambda d: "Learned 3" in text(d, "teach-status"), "the markup label's learn")
    assert XSS in text(browser, "teach-status")
    go(browser, "watch")
    wait(browser, lambda d: XSS in table(d, "classes-table"),
         "the markup label in the classes table")
    assert any(XSS in e.text for e in browser.find_elements("css selector", "#events li"))
    go(browser, "ask")
    card = _ask_file(browser, pictures["blue"][0])
    assert XSS in [e.text for e in card.find_elements("css selector", ".top .answer-label")]
    assert browser.find_elements("css selector", 'img[src="x"]') == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert not [m for m in severe_logs(browser) if "inline" in m or "Content Security" in m]


def _png_b64(a: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _use(browser, name: str) -> None:
    go(browser, "learners")
    wait(browser, lambda d: d.find_elements("css selector", f'button[aria-label="use {name}"]'),
         f"the use button of {name}")[0].click()
    wait(browser, lambda d: d.find_element("css selector", "#view-ask .learner-name").get_attribute(
        "textContent") == name, f"{name} in use")


def test_an_answer_the_learner_calls_novel_says_it_has_not_seen_this(browser, server, pictures,
                                                                     tmp_path):
    rng = np.random.default_rng(7)

    def red():
        a = rng.integers(0, 60, size=(48, 48, 3), dtype=np.uint8)
        a[..., 0] = rng.integers(180, 255, size=(48, 48))
        return a

    def blue():
        a = np.zeros((48, 48, 3), np.uint8)
        a[:, int(rng.integers(0, 4))::4, 2] = 255
        a[::3, :, 1] = int(rng.integers(60, 120))
        return a

    with api(server) as h:  # a learner whose threshold exists: 20 known-class feedback rows
        assert h.post("/v1/learners", json={"name": "seen", "method": "ncm"}).status_code == 201
        r = h.post("/v1/learners/seen/learn", json={
            "images": [_png_b64(f()) for f in (red, blue) * 3], "y": ["red", "blue"] * 3})
        assert r.status_code == 200, r.text
        for k in range(22):
            label, make = ("red", red) if k % 2 else ("blue", blue)
            p = h.post("/v1/learners/seen/predict", json={"images": [_png_b64(make())]}).json()
            fb = h.post("/v1/learners/seen/feedback",
                        json={"prediction_id": p["prediction_id"][0], "y": label})
            assert fb.status_code == 200, fb.text
        strange = np.full((48, 48, 3), 255, np.uint8)
        strange[8:40, 8:40] = (0, 160, 0)  # a green square on white: neither red nor blue
        candidates = [_png_b64(strange)] + [_png_b64(red()) for _ in range(4)]
        told = h.post("/v1/learners/seen/predict", json={"images": candidates}).json()
    # the server's rule (novelty above the 95th percentile of the known-class feedback's) says
    # which is novel; the page must say what the server says, for one image of each kind
    assert told["novel"][0] and not all(told["novel"][1:]), told["novelty"]
    known = 1 + told["novel"][1:].index(False)
    (tmp_path / "strange.png").write_bytes(base64.b64decode(candidates[0]))
    (tmp_path / "known.png").write_bytes(base64.b64decode(candidates[known]))
    _use(browser, "seen")
    go(browser, "ask")
    card = _ask_file(browser, tmp_path / "strange.png")
    assert card.find_element("css selector", ".novel").text == "I have not seen this before."
    assert card.find_elements("css selector", ".verdict") == []
    card = _ask_file(browser, tmp_path / "known.png")
    assert card.find_elements("css selector", ".novel") == []
    assert card.find_element("css selector", ".verdict strong").text == "red"
    _use(browser, "shop")


# ---------------------------------------------------------------------- look and reach
def test_a_screenshot_of_each_view_is_not_blank(browser, server, tmp_path):
    shots = {}
    for view in ("learners", "teach", "ask", "watch"):
        go(browser, view)
        browser.execute_script("window.scrollTo(0, 0);")
        if view == "watch":
            wait(browser, lambda d: d.execute_script(
                "return document.getElementById('acc-chart').width > 0"), "the chart")
        shots[view] = browser.get_screenshot_as_png()
        assert distinct_colours(shots[view]) > 40, view
    (tmp_path / "watch.png").write_bytes(shots["watch"])
    if os.environ.get("CIOSL_UPDATE_SCREENSHOT"):  # regenerate docs/serve-console.png
        (ROOT / "docs" / "serve-console.png").write_bytes(shots["watch"])
    browser.execute_script("sessionStorage.removeItem('ciosl-token'); location.hash = '';")
    browser.get(server.url + "/")
    wait(browser, lambda d: by_id(d, "view-signin").is_displayed(), "the sign-in view")
    assert distinct_colours(browser.get_screenshot_as_png()) > 40
    typed(browser, "token", server.token)
    browser.find_element("css selector", "#signin-form button[type=submit]").click()
    wait(browser, lambda d: by_id(d, "view-learners").is_displayed(), "signed in again")


def test_the_readme_shows_the_consoles_screenshot():
    png = ROOT / "docs" / "serve-console.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert distinct_colours(png.read_bytes()) > 40
    assert "docs/serve-console.png" in (ROOT / "README.md").read_text()


def test_at_a_phones_width_every_control_is_labelled_and_nothing_overflows(browser, server):
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {  # a phone's screen
        "width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
    try:
        for view in ("learners", "teach", "ask", "watch"):
            go(browser, view)
            wide = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth];")
            assert wide[0] <= wide[1] == 390, (view, wide)
            unlabelled = browser.execute_script("""
                const v = document.getElementById(arguments[0]);
                return Array.from(v.querySelectorAll('input, select, button, textarea'))
                  .filter((c) => c.offsetParent !== null)
                  .filter((c) => !((c.labels && c.labels.length) || c.getAttribute('aria-label')
                                   || (c.tagName === 'BUTTON' && c.textContent.trim())))
                  .map((c) => c.id || c.outerHTML.slice(0, 60));""", f"view-{view}")
            assert unlabelled == [], view
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    # the keyboard alone reaches the views: Tab to "Teach" and press Enter
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    go(browser, "learners")
    browser.execute_script("document.activeElement.blur(); window.scrollTo(0, 0);")
    for _ in range(12):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        if browser.execute_script("return document.activeElement.dataset.view") == "teach":
            break
    assert browser.execute_script("return document.activeElement.dataset.view") == "teach"
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait(browser, lambda d: by_id(d, "view-teach").is_displayed(), "the teach view by keyboard")


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


NPY_CASES = [  # (name, bytes, rows read or the start of the one line refusing it)
    ("f32.npy", _npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3) / 4),
     [[0, 0.25, 0.5], [0.75, 1, 1.25]]),
    ("f64.npy", _npy_bytes(np.array([1e-300, -2.5, 3.0])), [[1e-300, -2.5, 3.0]]),
    ("one-column.npy", _npy_bytes(np.ones((2, 1), np.float32)), [[1.0], [1.0]]),
    ("ints.npy", _npy_bytes(np.ones((2, 3), np.int64)), "ints.npy: dtype <i8"),
    ("big-endian.npy", _npy_bytes(np.ones(3, ">f4")), "big-endian.npy: dtype >f4"),
    ("cube.npy", _npy_bytes(np.ones((2, 2, 2), np.float32)), "cube.npy: shape (2, 2, 2)"),
    ("fortran.npy", _npy_bytes(np.asfortranarray(np.ones((2, 3), np.float32))),
     "fortran.npy: Fortran order"),
    ("empty.npy", _npy_bytes(np.ones((0, 3), np.float32)), "empty.npy: no samples"),
    ("cut.npy", _npy_bytes(np.ones((2, 3), np.float32))[:-4], "cut.npy: 20 data bytes"),
    ("nan.npy", _npy_bytes(np.array([[1.0, np.nan]], np.float32)),
     "nan.npy: row 0, column 1 is NaN"),
    ("text.npy", b"0.5 0.25\n", "text.npy: not a .npy file"),
]


def test_the_page_reads_npy_files_and_refuses_what_it_cannot_read_in_one_line(browser, server):
    browser.get(server.url + "/")  # the page's own parser, as a teacher's file reaches it
    read = browser.execute_async_script("""
        const [cases, done] = [arguments[0], arguments[arguments.length - 1]];
        import("/console/api.js").then((m) => done(cases.map(([name, b64]) => {
          const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
          try { return m.parseNpy(bytes.buffer, name); } catch (e) { return e.message; }
        })));""", [[name, base64.b64encode(raw).decode()] for name, raw, _ in NPY_CASES])
    for (name, _, expected), got in zip(NPY_CASES, read, strict=True):
        if isinstance(expected, list):
            assert got == expected, name
        else:
            assert isinstance(got, str) and got.startswith(expected) and "\n" not in got, \
                (name, got)


# ---------------------------------------------------------------------- without an extractor
def _npy(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def test_without_an_extractor_the_page_offers_feature_files(browser, tmp_path):
    rng = np.random.default_rng(3)
    a = _npy(tmp_path / "a.npy", rng.normal(0, 1, (3, 4)).astype(np.float32))
    b = _npy(tmp_path / "b.npy", (rng.normal(0, 1, 4) + 5.0).astype(np.float64))  # 1-d: a row
    ints = _npy(tmp_path / "ints.npy", np.ones((2, 4), np.int64))
    with Server(tmp_path / "srv", "--method", "ncm") as server:
        browser.get(server.url + "/")
        wait(browser, lambda d: by_id(d, "view-signin").is_displayed(), "the sign-in view")
        typed(browser, "token", server.token)
        browser.find_element("css selector", "#signin-form button[type=submit]").click()
        wait(browser, lambda d: by_id(d, "view-learners").is_displayed(), "signed in")
        go(browser, "ask")  # nothing learned yet: the server's 409, as its one line
        by_id(browser, "ask-files").send_keys(str(a))
        wait(browser, lambda d: text(d, "ask-error"), "the refusal before any class")
        assert text(browser, "ask-error").startswith("409: ")
        assert "\n" not in text(browser, "ask-error")
        go(browser, "teach")
        assert by_id(browser, "teach-noextractor").is_displayed()
        assert "--extractor" in text(browser, "teach-noextractor")
        assert not by_id(browser, "teach-camera").is_displayed()
        typed(browser, "teach-label", "a")
        by_id(browser, "teach-files").send_keys(str(a))
        wait(browser, lambda d: "Learned 3" in text(d, "teach-status"), "the float32 file")
        typed(browser, "teach-label", "b")
        by_id(browser, "teach-files").send_keys(str(b))
        wait(browser, lambda d: "Learned 1" in text(d, "teach-status"), "the float64 file")
        by_id(browser, "teach-files").send_keys(str(ints))
        wait(browser, lambda d: text(d, "teach-error"), "the int64 file's line")
        assert text(browser, "teach-error").startswith("ints.npy: dtype <i8")
        typed(browser, "teach-label", "a")  # a file dropped on the page
        browser.execute_script('''
            const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
            const files = new DataTransfer();
            files.items.add(new File([bytes], "dropped.npy"));
            const zone = document.getElementById("teach-drop");
            zone.dispatchEvent(new DragEvent("dragover", {dataTransfer: files, bubbles: true}));
            zone.dispatchEvent(new DragEvent("drop", {dataTransfer: files, bubbles: true}));''',
            base64.b64encode(_npy_bytes(rng.normal(0, 1, (2, 4)).astype(np.float32))).decode())
        wait(browser, lambda d: "Learned 2" in text(d, "teach-status"), "the dropped file")
        assert text(browser, "teach-error") == ""
        shown = learner(server, "default")
        assert shown["seen"] == 6 and sorted(shown["classes_list"]) == ["a", "b"]
        with api(server) as h:
            ask = h.post("/v1/predict", json={"x": np.load(b).reshape(1, -1).tolist()}).json()
        go(browser, "ask")
        card = _ask_file(browser, b)
        assert card.find_element("css selector", ".verdict strong").text == ask["label"][0] == "b"
