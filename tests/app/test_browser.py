"""Drive the web page in a headless Chromium against a live server.

Needs a system Chromium (Debian's ``chromium`` package) and the ``playwright``
Python package; the browser bundled by ``playwright install`` is never used.
Screenshots land in ``test-artifacts/`` at the repository root (those of the drawing's
before/after view and its full-size view also in ``$PAGE_SHOTS_DIR`` when that is set).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from pencil_testkit import live_server
from PIL import Image

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RENDER_TIMEOUT_MS = 60_000


def _chromium_path() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    return None


@pytest.fixture(scope="module")
def chromium_path() -> str:
    path = _chromium_path()
    if path is None:
        pytest.skip(
            "Chromium not found (no `chromium` on PATH, no /usr/bin/chromium); "
            "install Debian's chromium package to run the browser tests"
        )
    return path


@pytest.fixture(scope="module")
def server(chromium_path, tmp_path_factory):
    """The real app under uvicorn; yields (base_url, healthz body)."""
    with live_server(tmp_path_factory.mktemp("browser")) as base:
        yield base, httpx.get(f"{base}/healthz", timeout=5).json()


@pytest.fixture(scope="module")
def playwright_driver(chromium_path):
    """One Playwright for the module's browsers (its sync API runs one at a time per thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def _browser(playwright_driver, chromium_path: str, args: list[str]):
    """A headless system Chromium with `args`, closed after the module."""
    b = playwright_driver.chromium.launch(executable_path=chromium_path, headless=True, args=args)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def chromium_browser(playwright_driver, chromium_path):
    yield from _browser(playwright_driver, chromium_path, CHROMIUM_ARGS)


@pytest.fixture
def page_errors():
    return []


@pytest.fixture
def web_page(chromium_browser, page_errors):
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.on("pageerror", lambda exc: page_errors.append(str(exc)))
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    from PIL import Image
    from skimage import data

    path = tmp_path_factory.mktemp("photos") / "astronaut.jpg"
    Image.fromarray(data.astronaut()).save(path, "JPEG", quality=90)
    return path


def _is_sketch_request(req) -> bool:
    return req.method == "POST" and req.url.split("?")[0].endswith("/sketch")


def _wait_for_sketch(page, backend: str) -> None:
    page.wait_for_function(
        """(backend) => {
            const img = document.querySelector('#sketch');
            const status = document.querySelector('#status').textContent || '';
            return img && img.complete && img.naturalWidth > 0 && status.includes(backend);
        }""",
        arg=backend,
        timeout=RENDER_TIMEOUT_MS,
    )


NEWEST_JOB = "#jobs tbody tr:first-child"


def _wait_for_newest_job(page, kind: str) -> None:
    """Until the jobs table's first row is a `kind` job that has succeeded."""
    page.wait_for_function(
        """([selector, kind]) => {
            const row = document.querySelector(selector);
            return row && row.cells[0].textContent.startsWith(kind) && row.cells[1].textContent === 'succeeded';
        }""",
        arg=[NEWEST_JOB, kind],
        timeout=RENDER_TIMEOUT_MS,
    )


def _shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_photo_becomes_sketch(server, web_page, page_errors, photo):
    page = web_page
    base, health = server
    backend = health["backend"]
    page.goto(f"{base}/")
    # the footer reports the backend from /healthz
    page.wait_for_function(
        "(b) => document.querySelector('#backend').textContent.includes(b)", arg=backend, timeout=10_000
    )

    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as info:
        page.set_input_files("#file", str(photo))
    response = info.value
    assert response.ok, f"POST /sketch answered {response.status}: {response.text()[:500]}"
    _wait_for_sketch(page, backend)

    size = response.header_value("x-image-size")
    assert size, "POST /sketch did not send X-Image-Size"
    w, h = (int(v) for v in size.lower().split("x"))
    natural = page.eval_on_selector("#sketch", "img => [img.naturalWidth, img.naturalHeight]")
    assert natural == [w, h], f"sketch is {natural[0]}x{natural[1]} but X-Image-Size says {size}"
    assert max(w, h) <= 1024  # default max_side; astronaut is 512x512, same aspect
    assert w == h

    assert page.is_visible("#sketch")
    assert page.is_visible("#original")
    assert page.is_hidden("#error")
    assert page.get_attribute("#download", "href"), "download link has no target"
    assert page.get_attribute("#download", "download") == "astronaut-sketch.png"
    assert page.locator("#sketch").get_attribute("alt")
    assert page.locator("#original").get_attribute("alt")
    _shot(page, "browser-sketch.png")
    assert not page_errors, page_errors


RECORD_FORMS = """
(() => {
  window.__sketchForms = [];
  const realFetch = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const url = typeof input === 'string' ? input : input.url;
    if (url.endsWith('/sketch') && init && init.body instanceof FormData) {
      const fields = {};
      for (const [k, v] of init.body.entries()) fields[k] = typeof v === 'string' ? v : '<file ' + v.name + '>';
      window.__sketchForms.push(fields);
    }
    return realFetch(input, init);
  };
})();
"""


def test_options_rerender_debounced(server, web_page, page_errors, photo):
    page = web_page
    base, health = server
    backend = health["backend"]
    page.add_init_script(RECORD_FORMS)
    page.goto(f"{base}/")
    page.set_input_files("#file", str(photo))
    _wait_for_sketch(page, backend)
    first = page.evaluate("window.__sketchForms")
    assert len(first) == 1
    assert first[0]["image"] == "<file astronaut.jpg>"
    assert first[0]["mode"] == "gray" and first[0]["max_side"] == "1024" and first[0]["format"] == "png"
    assert "quality" not in first[0]  # PNG: no quality field

    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as info:
        page.click("label[for=mode-color]")
        page.focus("#stroke_width")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.select_option("#max_side", "")
    assert info.value.ok, info.value.text()[:500]
    _wait_for_sketch(page, backend)
    page.wait_for_timeout(500)
    forms = page.evaluate("window.__sketchForms")
    # quick changes inside the debounce window make a single request
    assert len(forms) == 2, f"expected one debounced request after the changes, saw {len(forms) - 1}"
    last = forms[-1]
    assert last["mode"] == "color"
    assert last["stroke_width"] == "3"
    assert "max_side" not in last  # "original": the field is omitted
    assert page.get_attribute("#download", "download") == "astronaut-sketch.png"
    assert not page_errors, page_errors


def test_rejects_text_file(server, web_page, page_errors, tmp_path):
    page = web_page
    base, _ = server
    notes = tmp_path / "notes.jpg"
    notes.write_text("These are my notes, not a photo.\n" * 20)
    page.goto(f"{base}/")
    page.set_input_files("#file", str(notes))
    page.wait_for_selector("#error", state="visible", timeout=RENDER_TIMEOUT_MS)
    message = page.inner_text("#error").strip()
    assert message, "#error is visible but empty"
    assert "notes.jpg" in message or "unsupported" in message.lower()
    # the page still works: nothing was drawn, the controls are still there
    assert page.eval_on_selector("#sketch", "img => img.naturalWidth") == 0
    assert page.is_enabled("#stroke_width")
    assert not page_errors, page_errors


def test_shows_the_servers_error(server, web_page, page_errors, tmp_path):
    """A file the page accepts but the server refuses (8x8 px: 400 image_too_small): the
    page shows the server's `detail`, with its prefix for a 400."""
    page = web_page
    base, _ = server
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (8, 8), (200, 120, 40)).save(tiny)
    page.goto(f"{base}/")
    page.set_input_files("#file", str(tiny))
    page.wait_for_selector("#error", state="visible", timeout=RENDER_TIMEOUT_MS)
    message = page.inner_text("#error").strip()
    assert message.startswith("Could not process the image") and "16 px" in message, message
    assert not page_errors, page_errors


def test_phone_layout_has_no_horizontal_scroll(server, chromium_browser, photo):
    base, health = server
    context = chromium_browser.new_context(
        viewport={"width": 375, "height": 800}, device_scale_factor=2, is_mobile=True, has_touch=True
    )
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/")
        page.set_input_files("#file", str(photo))
        _wait_for_sketch(page, health["backend"])
        scroll_width = page.evaluate("document.scrollingElement.scrollWidth")
        assert scroll_width <= 375 + 1, f"page is {scroll_width}px wide on a 375px screen"
        # stacked: the sketch sits below the original, not beside it
        orig = page.locator("#original").bounding_box()
        sketch = page.locator("#sketch").bounding_box()
        assert orig and sketch and sketch["y"] >= orig["y"] + orig["height"] - 1
        _shot(page, "browser-phone.png")
        assert not errors, errors
    finally:
        context.close()


# ------------------------------------------------------------ the jobs page --

JOBS_TOKEN = "browser-test-token"


@pytest.fixture(scope="module")
def jobs_server(chromium_path, tmp_path_factory):
    with live_server(tmp_path_factory.mktemp("jobs"), admin_token=JOBS_TOKEN) as base:
        yield base


def test_jobs_page_submits_an_svd_and_downloads_its_result(jobs_server, web_page, page_errors, tmp_path):
    page = web_page
    page.goto(f"{jobs_server}/")
    page.get_by_role("link", name="Batch jobs").click()
    page.wait_for_url("**/jobs-admin")
    page.fill("#token", "wrong")
    page.dispatch_event("#token", "change")
    page.wait_for_selector("#error:not([hidden])")
    assert "Bearer" in page.inner_text("#error")

    page.fill("#token", JOBS_TOKEN)
    page.dispatch_event("#token", "change")
    page.wait_for_selector("#empty:not([hidden])")
    page.fill("#m", "64")
    page.fill("#n", "48")
    page.select_option("#method", "lapack")
    page.click("#submit")
    page.wait_for_selector("#jobs tbody tr td:nth-child(2):text-is('succeeded')", timeout=RENDER_TIMEOUT_MS)
    assert "64x48 lapack" in page.inner_text("#jobs tbody tr")
    with page.expect_download() as download:
        page.click("#jobs tbody tr button.link:text-is('s.npy')")
    saved = tmp_path / "s.npy"
    download.value.save_as(saved)
    import numpy as np

    assert np.load(saved).shape == (48,)
    _shot(page, "jobs-page.png")
    assert page_errors == []


def test_jobs_page_submits_any_kind_as_json_and_shows_its_images(jobs_server, web_page, page_errors):
    """The JSON form lists every job kind with the API's example; a small stencil shot runs
    on the CPU backend and its PNG results appear as thumbnails in the list."""
    import json

    page = web_page
    page.goto(f"{jobs_server}/jobs-admin")
    page.fill("#token", JOBS_TOKEN)
    page.dispatch_event("#token", "change")
    page.wait_for_function("document.querySelectorAll('#json-kind option').length >= 2")
    kinds = page.eval_on_selector_all("#json-kind option", "options => options.map(o => o.value)")
    assert {"svd", "stencil"} <= set(kinds)
    page.select_option("#json-kind", "stencil")
    assert json.loads(page.input_value("#json-body"))["model"]["type"] == "layered"  # the API's example
    small = {
        "nx": 24,
        "ny": 20,
        "nz": 22,
        "h": 10.0,
        "steps": 40,
        "f0": 15.0,
        "source": [12, 10, 6],
        "receivers": {"start": [4, 10, 4], "end": [19, 10, 4], "count": 8},
        "model": {"type": "layered", "depths": [0, 100], "velocities": [1500, 2500]},
        "snapshot_every": 20,
    }
    page.fill("#json-body", json.dumps(small))
    page.click("#json-submit")
    _wait_for_newest_job(page, "stencil")
    assert "shot_record.png" in page.inner_text(NEWEST_JOB)
    page.wait_for_selector(f"{NEWEST_JOB} img.result-thumb")
    page.wait_for_function(
        f"[...document.querySelectorAll('{NEWEST_JOB} img.result-thumb')].every(img => img.complete && "
        "img.naturalWidth > 0)"
    )
    page.fill("#json-body", "{not json")
    page.click("#json-submit")
    page.wait_for_selector("#error:not([hidden])")
    assert "not JSON" in page.inner_text("#error")
    _shot(page, "jobs-page-json.png")
    assert page_errors == []


def test_jobs_page_stores_a_text_and_searches_it(jobs_server, web_page, page_errors, tmp_path):
    """Upload a text from the page, Search fills the JSON form with its corpus id, the search
    runs (CPU backend) and finds every overlapping occurrence; the text is then deleted."""
    import json

    text = tmp_path / "zen.txt"
    text.write_text("Beautiful is better than ugly.\nExplicit is better than implicit.\naaaa\n", encoding="utf-8")
    page = web_page
    page.goto(f"{jobs_server}/jobs-admin")
    page.fill("#token", JOBS_TOKEN)
    page.dispatch_event("#token", "change")
    page.wait_for_function("document.querySelectorAll('#json-kind option').length >= 2")
    page.click("#corpus-submit")
    page.wait_for_selector("#error:not([hidden])")
    assert "Choose a text file" in page.inner_text("#error")

    page.set_input_files("#corpus-file", str(text))
    page.fill("#corpus-name", "zen")
    page.click("#corpus-submit")
    page.wait_for_selector("#corpora li:has-text('zen')")
    # the list is redrawn a moment before the form is filled (the same handler, after an await)
    page.wait_for_function("document.querySelector('#json-kind').value === 'search'", timeout=10_000)
    assert page.input_value("#json-kind") == "search"
    body = json.loads(page.input_value("#json-body"))
    assert len(body["corpus_id"]) == 32 and "text" not in body
    body["patterns"] = ["better", "aa"]
    body["positions"] = "files"  # the position files listed with the job (json, the default, writes none)
    page.fill("#json-body", json.dumps(body))
    page.click("#json-submit")
    _wait_for_newest_job(page, "search")
    assert "positions_1.npy" in page.inner_text(NEWEST_JOB)
    assert '"better" ×2, "aa" ×3 in 70 B' in page.inner_text(NEWEST_JOB)
    token = {"Authorization": f"Bearer {JOBS_TOKEN}"}
    jobs = page.request.get(f"{jobs_server}/jobs?kind=search", headers=token).json()["jobs"]
    result = page.request.get(f"{jobs_server}{jobs[0]['result_url']}", headers=token).json()["result"]
    assert [p["count"] for p in result["patterns"]] == [2, 3]  # "aa" overlaps three times in "aaaa"

    _shot(page, "jobs-page-search.png")
    page.click("#corpora li:has-text('zen') button:text-is('Delete')")
    page.wait_for_function("!document.querySelector('#corpora').textContent.includes('zen')")
    assert page_errors == []


# ------------------------------------------------------------- the API docs --


def _offline(page, base: str) -> tuple[list[tuple[str, str]], list[tuple[str, str | None]]]:
    """Abort every request to another host than the server's. Returns (resource type, URL) of
    those that reached the network (the route aborted them), and (URL, failure) of every
    off-host request the page tried, filled in as they fail: "csp" when the browser itself
    refused to send it (the page's Content-Security-Policy)."""
    host = httpx.URL(base).host
    sent: list[tuple[str, str]] = []
    tried: list[tuple[str, str | None]] = []

    def off_host(url: str) -> bool:
        return url.startswith(("http:", "https:")) and httpx.URL(url).host not in (host, "localhost")

    def route(r):
        if off_host(r.request.url):
            sent.append((r.request.resource_type, r.request.url))
            r.abort()
        else:
            r.continue_()

    page.on("requestfailed", lambda r: off_host(r.url) and tried.append((r.url, r.failure)))
    page.route("**/*", route)
    return sent, tried


def test_swagger_ui_renders_offline(server, web_page, page_errors):
    page = web_page
    base, _ = server
    blocked, tried = _offline(page, base)
    page.goto(f"{base}/docs")
    page.wait_for_selector(".swagger-ui .information-container .title", timeout=RENDER_TIMEOUT_MS)
    assert "pencil-gpu" in page.inner_text(".swagger-ui .information-container .title")
    page.wait_for_selector(".swagger-ui .opblock-summary-path[data-path='/sketch']")
    for tag in ("sketch", "jobs", "corpora", "operations"):
        assert page.is_visible(f".swagger-ui h3.opblock-tag[data-tag='{tag}']"), tag
    assert page.locator(".swagger-ui .opblock").count() >= 10
    authorize = page.locator(".swagger-ui button.authorize").first
    assert authorize.is_visible()
    authorize.click()
    page.wait_for_selector(".swagger-ui .modal-ux")
    assert "Bearer" in page.inner_text(".swagger-ui .modal-ux")
    _shot(page, "docs-swagger-offline.png")
    assert blocked == [] and tried == [], (blocked, tried)
    assert not page_errors, page_errors


def test_redoc_renders_offline(server, web_page, page_errors):
    page = web_page
    base, _ = server
    blocked, tried = _offline(page, base)
    page.goto(f"{base}/redoc")
    page.wait_for_selector(".api-content h1", timeout=RENDER_TIMEOUT_MS)
    assert "pencil-gpu" in page.inner_text(".api-content h1")
    menu = page.inner_text(".menu-content")
    assert all(tag in menu.lower() for tag in ("sketch", "jobs", "corpora", "operations")), menu
    assert "adminToken" in page.inner_text(".api-content")  # the Authentication section
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-redoc-offline.png"))  # the viewport: the whole page is very long
    # ReDoc's bundle asks for its "API docs by Redocly" logo on cdn.redoc.ly: the page's
    # Content-Security-Policy (app/docs_pages.py) stops the browser before the request leaves,
    # and the logo hides itself
    page.wait_for_timeout(500)
    assert blocked == [], f"requests sent to other hosts: {blocked}"
    assert all(failure == "csp" for _, failure in tried), tried
    assert not page_errors, page_errors


# ------------------------------------------- tone auto, before/after, full size --


def _shot_also(page, name: str, *, full_page: bool = True, selector: str | None = None) -> Path:
    """A screenshot in test-artifacts/ (of the element `selector` when given, else of the
    page), and a copy in $PAGE_SHOTS_DIR when that is set (e.g. /tmp/page-shots), to look at by eye."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    if selector:
        page.locator(selector).screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("PAGE_SHOTS_DIR"):
        shots = Path(os.environ["PAGE_SHOTS_DIR"])
        shots.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, shots / name)
    return path


def _pixels(page, selector: str):
    """The element as the page shows it, as a float array (H, W, 3)."""
    import io

    import numpy as np

    return np.asarray(Image.open(io.BytesIO(page.locator(selector).screenshot())).convert("RGB"), dtype=np.float64)


def _split(page) -> float:
    """The divider's position, in % from the left, as the page draws it."""
    return page.eval_on_selector("#compare", "el => parseFloat(getComputedStyle(el).getPropertyValue('--split'))")


SKETCH_PIXELS = """img => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  return Array.from(g.getImageData(0, 0, c.width, c.height).data.filter((_, i) => i % 4 === 0));
}"""


def test_tone_auto_by_keyboard_is_sent_and_drawn(server, web_page, page_errors, photo):
    page = web_page
    base, health = server
    page.add_init_script(RECORD_FORMS)
    page.goto(f"{base}/")
    tones = page.eval_on_selector_all("input[name=tone]", "els => els.map(e => e.value)")
    assert tones == ["light", "medium", "dark", "auto"]
    assert page.is_checked("#tone-auto")  # the page's default, the server's too
    assert "dark photos stay dark" in page.get_attribute("label[for=tone-auto]", "title")
    for name in ("Light", "Medium", "Dark", "Auto"):
        assert page.get_by_role("radio", name=name, exact=True).count() == 1, name
    described = page.eval_on_selector("#tone-auto", "e => document.getElementById(e.getAttribute('aria-describedby'))")
    assert described is not None
    # four choices in the narrow column: no label is cut off, whichever is checked (in bold)
    for tone in tones:
        page.click(f"label[for=tone-{tone}]")
        cut = page.eval_on_selector_all(
            ".segmented label", "els => els.filter(l => l.scrollWidth > l.clientWidth).map(l => l.textContent)"
        )
        assert cut == [], (tone, cut)
    page.click("label[for=tone-light]")

    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as light:
        page.set_input_files("#file", str(photo))
    assert light.value.ok
    _wait_for_sketch(page, health["backend"])
    light_px = page.eval_on_selector("#sketch", SKETCH_PIXELS)

    # arrow keys move through the radio group like any other; quick presses make one request
    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as auto:
        page.focus("#tone-light")
        for _ in range(3):
            page.keyboard.press("ArrowRight")
    assert page.is_checked("#tone-auto")
    assert page.evaluate("document.activeElement.id") == "tone-auto"
    assert auto.value.ok, auto.value.text()[:500]
    _wait_for_sketch(page, health["backend"])
    page.wait_for_timeout(400)
    forms = page.evaluate("window.__sketchForms")
    assert [f["tone"] for f in forms] == ["light", "auto"]
    assert page.eval_on_selector("#sketch", "img => img.naturalWidth") == 512
    auto_px = page.eval_on_selector("#sketch", SKETCH_PIXELS)
    assert len(auto_px) == len(light_px) == 512 * 512
    assert auto_px != light_px, "tone=auto drew the same image as tone=light"
    assert not page_errors, page_errors


def test_hatching_flat_by_keyboard_is_sent_and_drawn(server, web_page, page_errors, photo):
    """The Hatching group (Flat | Follow forms, Follow the default since issue 38) is a radio
    group like Tone: reached by Tab from the group before it, Flat chosen by an arrow key is
    sent as hatching=flat and draws another image than Follow; Reset returns to Follow and
    draws again."""
    import numpy as np

    page = web_page
    base, health = server
    assert health["defaults"]["hatching"] == "follow"
    page.add_init_script(RECORD_FORMS)
    page.goto(f"{base}/")
    page.wait_for_function(  # /healthz has answered: its defaults are applied
        "(b) => document.querySelector('#backend').textContent.includes(b)", arg=f"Backend: {health['backend']}"
    )
    values = page.eval_on_selector_all("input[name=hatching]", "els => els.map(e => e.value)")
    assert values == ["flat", "follow"]
    assert page.is_checked("#hatching-follow")  # the page's default, the server's too
    assert page.get_by_role("group", name="Hatching").count() == 1
    for name in ("Flat", "Follow forms"):
        assert page.get_by_role("radio", name=name, exact=True).count() == 1, name
    assert "edges and contours" in page.get_attribute("label[for=hatching-follow]", "title")
    hint = page.eval_on_selector(
        "#hatching-follow", "e => document.getElementById(e.getAttribute('aria-describedby')).textContent"
    )
    assert hint == "Follow: the hatching turns along edges and contours."
    # two choices in the narrow column: no label is cut off, whichever is checked (in bold), and
    # the group lines up with Tone's above it
    tone_box = page.locator("#tone-light + label").evaluate("l => l.parentElement.getBoundingClientRect().toJSON()")
    for value in values:
        page.click(f"label[for=hatching-{value}]")
        cut = page.eval_on_selector_all(
            ".segmented label", "els => els.filter(l => l.scrollWidth > l.clientWidth).map(l => l.textContent)"
        )
        assert cut == [], (value, cut)
        box = page.locator("#hatching-flat + label").evaluate("l => l.parentElement.getBoundingClientRect().toJSON()")
        assert (box["x"], box["width"]) == (tone_box["x"], tone_box["width"]), (box, tone_box)
    page.click("label[for=hatching-follow]")
    _shot_also(page, "browser-options.png", selector=".controls")

    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as follow:
        page.set_input_files("#file", str(photo))
    assert follow.value.ok
    _wait_for_sketch(page, health["backend"])
    follow_px = page.eval_on_selector("#sketch", SKETCH_PIXELS)

    # Tab from the Texture group lands on the checked Hatching radio, with a visible focus ring;
    # an arrow key chooses Flat
    page.focus("#texture-lu")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "hatching-follow"
    ring = page.eval_on_selector("label[for=hatching-follow]", "l => getComputedStyle(l).outlineStyle")
    assert ring != "none", "no focus ring on the keyboard-focused Hatching choice"
    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as flat:
        page.keyboard.press("ArrowLeft")
    assert page.is_checked("#hatching-flat")
    assert page.evaluate("document.activeElement.id") == "hatching-flat"
    assert flat.value.ok, flat.value.text()[:500]
    _wait_for_sketch(page, health["backend"])
    page.wait_for_timeout(400)
    forms = page.evaluate("window.__sketchForms")
    assert [f["hatching"] for f in forms] == ["follow", "flat"]
    assert page.eval_on_selector("#sketch", "img => img.naturalWidth") == 512
    flat_px = page.eval_on_selector("#sketch", SKETCH_PIXELS)
    assert len(follow_px) == len(flat_px) == 512 * 512
    changed = float(np.mean(np.asarray(follow_px) != np.asarray(flat_px)))
    assert changed > 0.1, f"hatching=flat changed only {changed:.1%} of the pixels of hatching=follow"
    _shot_also(page, "browser-hatching-flat.png", selector="#sketch-view")

    # Reset returns to Follow and draws again
    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as reset:
        page.click("#reset")
    assert reset.value.ok
    assert page.is_checked("#hatching-follow")
    _wait_for_sketch(page, health["backend"])
    assert page.evaluate("window.__sketchForms.at(-1).hatching") == "follow"
    assert not page_errors, page_errors


SERVER_DEFAULTS = {
    "tone": "auto",
    "hatching": "follow",
    "stroke_width": 2,
    "max_side": 2048,
    "unknown_option": 1,
    "mode": "sepia",
}


def _healthz_with_defaults(route) -> None:
    import json

    body = route.fetch().json()
    body["defaults"] = SERVER_DEFAULTS
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))


def test_server_defaults_from_healthz_are_selected(server, web_page, page_errors):
    """If /healthz names the options' defaults, the page selects them and Reset returns to them."""
    page = web_page
    base, _ = server
    page.route("**/healthz", _healthz_with_defaults)
    page.goto(f"{base}/")
    # tone=auto is also the page's own default: wait for a value only the server's defaults give
    page.wait_for_function("document.querySelector('#stroke_width').value === '2'", timeout=10_000)
    assert page.is_checked("#tone-auto")
    assert page.input_value("#stroke_width") == "2" and page.inner_text("#stroke_width-out") == "2"
    assert page.input_value("#max_side") == "2048"
    assert page.is_checked("#hatching-follow")
    assert page.is_checked("#mode-gray")  # a value the page does not offer changes nothing
    page.click("label[for=tone-dark]")
    page.click("label[for=hatching-flat]")
    page.click("#reset")
    page.wait_for_function("document.querySelector('#tone-auto').checked")
    assert page.input_value("#stroke_width") == "2"
    assert page.is_checked("#hatching-follow")
    assert not page_errors, page_errors


def test_server_defaults_keep_what_the_user_chose(server, web_page, page_errors):
    """Defaults that arrive after the user changed a field leave that field as the user set it."""
    page = web_page
    base, health = server
    held = []
    page.route("**/healthz", lambda route: held.append(route))  # answered below, once the user has chosen
    page.goto(f"{base}/")
    page.click("label[for=tone-dark]")
    page.select_option("#max_side", "")
    page.focus("#stroke_width")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # 1 -> 3
    page.wait_for_function("() => true")  # lets the held /healthz request come in
    assert len(held) == 1
    _healthz_with_defaults(held[0])
    page.wait_for_function(
        "(b) => document.querySelector('#backend').textContent.includes(b)", arg=f"Backend: {health['backend']}"
    )
    assert page.is_checked("#tone-dark")
    assert page.is_checked("#hatching-follow")  # untouched: the server's default
    assert page.input_value("#max_side") == ""
    assert page.input_value("#stroke_width") == "3"
    page.click("#reset")
    page.wait_for_function("document.querySelector('#tone-auto').checked")
    assert page.input_value("#max_side") == "2048" and page.input_value("#stroke_width") == "2"
    assert not page_errors, page_errors


@pytest.mark.parametrize("mode", ["gray", "color"])
def test_before_after_slider(server, web_page, page_errors, photo, mode):
    import numpy as np

    page = web_page
    base, health = server
    page.goto(f"{base}/")
    page.click(f"label[for=mode-{mode}]")
    page.set_input_files("#file", str(photo))
    _wait_for_sketch(page, health["backend"])
    page.wait_for_function("document.querySelector('#compare-photo').complete")
    assert page.is_visible("#compare") and page.is_visible("#compare-hint")

    # the photo lies exactly over the drawing, in a box of the drawing's shape (512 x 512, scaled to the column)
    sketch = page.locator("#sketch").bounding_box()
    photo_box = page.locator("#compare-photo").bounding_box()
    assert sketch == photo_box, (sketch, photo_box)
    assert 200 < sketch["width"] <= 512 and abs(sketch["width"] - sketch["height"]) < 1, sketch

    # it starts on the drawing alone
    assert _split(page) == 0
    assert page.input_value("#compare-range") == "0"
    assert page.get_attribute("#compare-range", "aria-valuetext") == "Drawing only"
    drawing = _pixels(page, "#compare")

    # the keyboard: Tab-reachable range, End shows the photo alone
    page.focus("#compare-range")
    page.keyboard.press("End")
    assert _split(page) == 100 and page.get_attribute("#compare-range", "aria-valuetext") == "Photo only"
    photo_px = _pixels(page, "#compare")
    assert np.abs(drawing - photo_px).mean() > 15, "the photo and the drawing look alike"
    clip_end = page.eval_on_selector("#compare-before", "el => getComputedStyle(el).clipPath")

    page.keyboard.press("Home")
    assert _split(page) == 0
    page.keyboard.press("ArrowRight")
    assert _split(page) == 5 and page.input_value("#compare-range") == "5"
    page.keyboard.press("PageUp")
    page.keyboard.press("PageUp")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowRight")
    assert _split(page) == 55
    page.keyboard.press("ArrowLeft")
    assert _split(page) == 50
    assert page.eval_on_selector("#compare-before", "el => getComputedStyle(el).clipPath") != clip_end
    half = _pixels(page, "#compare")
    w = half.shape[1]
    left, right = slice(0, int(w * 0.44)), slice(int(w * 0.56), w)

    def diff(a, b, cols):
        return float(np.abs(a[:, cols] - b[:, cols]).mean())

    # left of the divider the photo's pixels, right of it the drawing's
    assert diff(half, photo_px, left) < 2 < 10 < diff(half, drawing, left), (
        diff(half, photo_px, left),
        diff(half, drawing, left),
    )
    assert diff(half, drawing, right) < 2 < 10 < diff(half, photo_px, right), (
        diff(half, drawing, right),
        diff(half, photo_px, right),
    )
    _shot_also(page, f"browser-compare-{mode}.png")

    # the mouse: a sideways drag from anywhere on the drawing moves the divider to the pointer,
    # and does not open the full-size view
    box = page.locator("#compare").bounding_box()
    y = box["y"] + box["height"] * 0.3
    page.mouse.move(box["x"] + box["width"] * 0.7, y)
    page.mouse.down()
    for frac in (0.6, 0.45, 0.3, 0.25):
        page.mouse.move(box["x"] + box["width"] * frac, y)
    page.mouse.up()
    assert abs(_split(page) - 25) < 0.5, _split(page)
    assert page.input_value("#compare-range") == "25"
    assert not page.evaluate("document.querySelector('#fullsize').open"), "a drag opened the full-size view"
    # the knob drags too, and a press on it without a move does not open the view either
    knob = page.locator(".compare-knob").bounding_box()
    kx, ky = knob["x"] + knob["width"] / 2, knob["y"] + knob["height"] / 2
    page.mouse.click(kx, ky)
    assert not page.evaluate("document.querySelector('#fullsize').open")
    page.mouse.move(kx, ky)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, ky, steps=4)
    page.mouse.move(box["x"] + box["width"] * 1.5, ky, steps=4)  # past the edge: stops at 100
    page.mouse.up()
    assert _split(page) == 100
    assert not page.evaluate("document.querySelector('#fullsize').open")

    # a new render (another option) keeps the divider where the user left it
    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS):
        page.click("label[for=tone-dark]")
    _wait_for_sketch(page, health["backend"])
    assert _split(page) == 100
    assert page.get_attribute("#download", "href") == page.get_attribute("#sketch", "src")
    assert not page_errors, page_errors


def test_full_size_view(server, web_page, page_errors, tmp_path):
    """A click on the drawing opens it one image pixel per CSS pixel in a scrolling overlay;
    Escape, the close button and a click outside close it."""
    from pencil_testkit import photo as test_photo

    page = web_page
    base, health = server
    big = tmp_path / "coffee.jpg"
    Image.fromarray(test_photo("coffee", width=1600)).save(big, "JPEG", quality=90)  # 1600 x 1066
    page.goto(f"{base}/")
    page.select_option("#max_side", "2048")
    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as info:
        page.set_input_files("#file", str(big))
    assert info.value.ok, info.value.text()[:500]
    _wait_for_sketch(page, health["backend"])
    width, height = (int(v) for v in info.value.header_value("x-image-size").split("x"))
    assert width == 1600
    shown = page.locator("#sketch").bounding_box()
    assert shown["width"] < width  # on the page it is scaled down to the column

    # a click (no drag) on the drawing, away from the divider's knob
    page.click("#sketch", position={"x": shown["width"] * 0.75, "y": shown["height"] * 0.75})
    page.wait_for_selector("#fullsize[open]")
    full = page.eval_on_selector(
        "#fullsize-img",
        "img => { const r = img.getBoundingClientRect(); return [img.naturalWidth, img.naturalHeight, r.width, "
        "r.height, img.src === document.querySelector('#sketch').src]; }",
    )
    assert full == [width, height, width, height, True], full
    scroll = page.eval_on_selector("#fullsize-scroll", "el => [el.scrollWidth, el.clientWidth]")
    assert scroll[0] > scroll[1], f"a {width} px drawing in a 1280 px window should scroll: {scroll}"
    assert page.inner_text("#fullsize-size") == f"{width} × {height} px"
    assert page.evaluate("document.activeElement.id") == "fullsize-close"
    # the page behind does not scroll while the view is open
    assert page.evaluate("getComputedStyle(document.documentElement).overflow") == "hidden"
    _shot_also(page, "browser-fullsize.png", full_page=False)
    page.keyboard.press("Escape")
    page.wait_for_selector("#fullsize", state="hidden")
    # the dialog's "close" event, which lets the page scroll again, comes a task after it hides
    page.wait_for_function("!document.documentElement.classList.contains('lightbox-open')", timeout=5000)

    # the keyboard way in: the full-size button; focus comes back to it afterwards
    page.focus("#fullsize-open")
    page.keyboard.press("Enter")
    page.wait_for_selector("#fullsize[open]")
    page.click("#fullsize-close")
    page.wait_for_selector("#fullsize", state="hidden")
    page.wait_for_function("document.activeElement.id === 'fullsize-open'", timeout=5000)  # on "close", as above

    # a click on the dark surround closes it; one on the drawing does not
    page.click("#fullsize-open")
    page.wait_for_selector("#fullsize[open]")
    page.click("#fullsize-img", position={"x": 50, "y": 50})
    assert page.evaluate("document.querySelector('#fullsize').open")
    page.click("#fullsize-scroll", position={"x": 6, "y": 6})
    page.wait_for_selector("#fullsize", state="hidden")

    # the download link is untouched by all this
    assert page.get_attribute("#download", "download") == "coffee-sketch.png"
    assert page.get_attribute("#download", "href") == page.get_attribute("#sketch", "src")
    assert not page_errors, page_errors


def test_before_after_by_touch(server, chromium_browser, photo):
    """On a phone: a sideways swipe on the drawing moves the divider, a vertical one scrolls the
    page and leaves the divider alone, and a tap opens the full-size view."""
    base, health = server
    context = chromium_browser.new_context(
        viewport={"width": 375, "height": 800}, device_scale_factor=2, is_mobile=True, has_touch=True
    )
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/")
        page.set_input_files("#file", str(photo))
        _wait_for_sketch(page, health["backend"])
        page.locator("#compare").scroll_into_view_if_needed()
        box = page.locator("#compare").bounding_box()
        cdp = context.new_cdp_session(page)

        def swipe(points: list[tuple[float, float]]) -> None:
            for i, (fx, fy) in enumerate(points):
                point = {"x": box["x"] + box["width"] * fx, "y": box["y"] + box["height"] * fy}
                kind = "touchStart" if i == 0 else "touchMove"
                cdp.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": [point]})
            cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})

        swipe([(0.8, 0.3), (0.75, 0.3), (0.7, 0.3), (0.6, 0.3), (0.5, 0.3), (0.4, 0.3)])
        assert abs(_split(page) - 40) < 0.5, _split(page)
        assert not page.evaluate("document.querySelector('#fullsize').open")

        scrolled = page.evaluate("scrollY")
        swipe([(0.3, 0.8), (0.3, 0.7), (0.3, 0.6), (0.3, 0.5), (0.3, 0.4), (0.3, 0.3)])
        page.wait_for_function("(y) => scrollY > y", arg=scrolled)
        assert abs(_split(page) - 40) < 0.5, _split(page)
        assert not page.evaluate("document.querySelector('#fullsize').open")

        box = page.locator("#compare").bounding_box()
        page.touchscreen.tap(box["x"] + box["width"] * 0.8, box["y"] + box["height"] * 0.8)
        page.wait_for_selector("#fullsize[open]")
        page.tap("#fullsize-close")
        page.wait_for_selector("#fullsize", state="hidden")
        assert not errors, errors
    finally:
        context.close()


# ------------------------------------------------------------- the Live view --
#
# Chromium's fake camera (a green test pattern with a moving disc and a clock, 1280x720 when
# asked) stands in for a webcam; its fake permission prompt says yes. The frames go through the
# real app's /live (CPU backend), so the drawing is the pipeline's.

CAMERA_ARGS = [*CHROMIUM_ARGS, "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]

# Counts the page's object URLs still alive (created, not revoked) and keeps its camera streams.
LIVE_PROBES = """
(() => {
  window.__liveUrls = new Set();
  const create = URL.createObjectURL.bind(URL);
  const revoke = URL.revokeObjectURL.bind(URL);
  URL.createObjectURL = (blob) => { const url = create(blob); window.__liveUrls.add(url); return url; };
  URL.revokeObjectURL = (url) => { window.__liveUrls.delete(url); revoke(url); };
  window.__streams = [];
  if (navigator.mediaDevices) {
    const getUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    navigator.mediaDevices.getUserMedia = async (constraints) => {
      const stream = await getUserMedia(constraints);
      window.__streams.push(stream);
      return stream;
    };
  }
})();
"""

# Every camera stream the page opened (at least `n`) has all its tracks stopped.
TRACKS_ENDED = """(n = 1) => window.__streams.length >= n &&
    window.__streams.every(s => s.getTracks().every(t => t.readyState === 'ended'))"""

# The drawing shown, read back through a canvas: its size, mean grey, spread and mean chroma
# (max - min of R, G, B: 0 for a grey image); null while a newer one loads.
DRAWING_STATS = """img => {
  if (!img.complete || !img.naturalWidth) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d', { willReadFrequently: true });
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let sum = 0, squares = 0, chroma = 0;
  for (let i = 0; i < d.length; i += 4) {
    const y = (d[i] + d[i + 1] + d[i + 2]) / 3;
    sum += y; squares += y * y;
    chroma += Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]);
  }
  const n = d.length / 4, mean = sum / n;
  const std = Math.sqrt(Math.max(0, squares / n - mean * mean));
  return { width: c.width, height: c.height, mean, std, chroma: chroma / n };
}"""


def _drawing_stats(page, condition: str = "true", arg=None) -> dict:
    """DRAWING_STATS of the drawing shown, once one has loaded and `condition` (JavaScript
    of the stats `s` and `arg`) holds: each new frame replaces the image, which reads as
    null until it has decoded, so a single read can fall between two frames."""
    handle = page.wait_for_function(
        f"([img, arg]) => {{ const s = ({DRAWING_STATS})(img); return s && ({condition}) ? s : null; }}",
        arg=[page.query_selector("#live-drawing"), arg],
        timeout=RENDER_TIMEOUT_MS,
    )
    return handle.json_value()


@pytest.fixture(scope="module")
def camera_browser(playwright_driver, chromium_path):
    """A Chromium with the fake camera and the fake permission prompt (which allows)."""
    yield from _browser(playwright_driver, chromium_path, CAMERA_ARGS)


@pytest.fixture
def live_errors():
    """Uncaught exceptions and console errors of the page."""
    return []


def _camera_context(camera_browser, live_errors, **options):
    context = camera_browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **options})
    context.add_init_script(LIVE_PROBES)

    def watch(page):
        page.on("pageerror", lambda exc: live_errors.append(f"pageerror: {exc}"))
        page.on("console", lambda m: m.type == "error" and live_errors.append(f"console: {m.text}"))

    context.on("page", watch)
    return context


@pytest.fixture
def live_page(camera_browser, live_errors):
    context = _camera_context(camera_browser, live_errors)
    try:
        yield context.new_page()
    finally:
        context.close()


def _live_sessions(base: str) -> tuple[int, float | None]:
    """The server's open /live sessions: (GET /healthz live.sessions, /metrics pencil_live_sessions)."""
    from pencil_testkit import metric_value

    health = httpx.get(f"{base}/healthz", timeout=5).json()
    gauge = metric_value(httpx.get(f"{base}/metrics", timeout=5).text, "pencil_live_sessions")
    return health["live"]["sessions"], gauge


def _wait_for_sessions(base: str, count: int, timeout_s: float = 15) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while (seen := _live_sessions(base)) != (count, count):
        assert time.monotonic() < deadline, f"the server counts {seen} live sessions (/healthz, /metrics), not {count}"
        time.sleep(0.1)


def _frames_drawn(page) -> int:
    return int(page.get_attribute("#live-frames", "data-count"))


def _wait_for_frames(page, count: int) -> None:
    """Until the page has shown `count` drawings more than now, the last one loaded."""
    target = _frames_drawn(page) + count
    page.wait_for_function(
        """(n) => Number(document.querySelector('#live-frames').dataset.count) >= n &&
                  document.querySelector('#live-drawing').complete""",
        arg=target,
        timeout=RENDER_TIMEOUT_MS,
    )


def _start_live(page, base: str, *labels: str) -> None:
    """Open the Live view, click the option labels given (e.g. "texture-fast"), start the camera
    and wait for the first drawings."""
    page.goto(f"{base}/#live")
    page.wait_for_selector("#live-view", state="visible")
    for label in labels:
        page.click(f"label[for={label}]")
    page.click("#live-toggle")
    _wait_for_frames(page, 3)


def test_live_frames_come_back_drawn(server, live_page, live_errors):
    """The Live tab: the camera beside its drawing, drawn frames counted, the rate and the
    latencies shown; Stop closes the connection and turns the camera off, leaking no object URL."""
    import re

    page = live_page
    base, health = server
    _wait_for_sessions(base, 0)
    page.goto(f"{base}/")
    page.get_by_role("link", name="Live", exact=True).click()
    assert page.url.endswith("/#live")
    assert page.get_attribute(".tabs a[data-view=live]", "aria-current") == "page"
    assert page.get_attribute(".tabs a[data-view=sketch]", "aria-current") is None
    assert page.is_visible("#live-view") and page.is_hidden("#sketch-view")
    assert page.is_hidden("#format-field"), "live drawings are JPEG: the Format choice is the Sketch view's"
    assert page.is_enabled("#quality")
    assert page.is_disabled("#live-snapshot")
    toggle = page.get_by_role("button", name="Start camera")
    assert toggle.count() == 1

    with page.expect_websocket(lambda ws: "/live?" in ws.url) as opened:
        toggle.click()
    query = opened.value.url.split("?", 1)[1]
    # on the CPU backend the Live view starts at 640 px with texture fast (live.js CPU_LIVE_DEFAULTS)
    side, texture = (640, "fast") if health["backend"] == "cpu" else (1024, "lu")
    assert "format=jpeg" in query and "mode=gray" in query and f"max_side={side}" in query, query
    assert f"texture={texture}" in query, query
    assert page.is_visible("#live-cpu-hint") is (health["backend"] == "cpu")
    _wait_for_frames(page, 5)
    assert page.get_by_role("button", name="Stop camera").count() == 1
    video = page.eval_on_selector("#live-video", "v => [v.videoWidth, v.videoHeight, v.paused]")
    assert video == [1280, 720, False], video  # the ideal 1280x720 the page asked for
    stats = _drawing_stats(page)
    assert (stats["width"], stats["height"]) == (side, side * 9 // 16), stats  # max_side, the camera's shape
    assert stats["std"] > 5 and stats["mean"] > 100, f"the drawing looks empty: {stats}"
    assert page.get_attribute("#live-drawing", "alt").startswith("Pencil drawing of the camera image")

    _wait_for_frames(page, 3)  # the rate needs a few drawings
    page.wait_for_function("/fps$/.test(document.querySelector('#live-fps').textContent)", timeout=5000)
    fps = float(page.inner_text("#live-fps").split()[0])
    assert fps > 0, fps
    for stat in ("#live-latency", "#live-rtt"):
        assert re.fullmatch(r"\d+(\.\d)? ms", page.inner_text(stat)), (stat, page.inner_text(stat))
    assert health["backend"] in page.inner_text("#live-status")
    assert page.get_attribute("#live-status", "aria-live") == "polite"
    assert page.is_hidden("#live-error")
    assert _live_sessions(base) == (1, 1)
    assert page.evaluate("window.__liveUrls.size") <= 2, "drawings' object URLs are not revoked"
    _shot_also(page, "browser-live.png")

    page.get_by_role("button", name="Stop camera").click()
    assert page.get_by_role("button", name="Start camera").count() == 1
    page.wait_for_function(TRACKS_ENDED, timeout=5000)
    assert page.eval_on_selector("#live-video", "v => v.srcObject") is None
    _wait_for_sessions(base, 0)
    assert page.is_visible("#live-drawing"), "the last drawing stays after Stop"
    assert page.evaluate("window.__liveUrls.size") == 1  # the drawing shown
    assert not live_errors, live_errors


def test_live_options_change_the_drawing(server, live_page, live_errors):
    """Options changed while the camera runs go out as an "options" message and the drawings
    after it follow them: Color gives colour where Gray gave none, "Original size" the camera's
    1280x720, a higher tone darkness a darker drawing."""
    import json

    page = live_page
    base, _ = server
    sent: list[dict] = []

    def record(ws):
        if "/live?" in ws.url:
            ws.on("framesent", lambda payload: isinstance(payload, str) and sent.append(json.loads(payload)))

    page.on("websocket", record)
    _start_live(page, base, "texture-fast")
    gray = _drawing_stats(page)
    assert gray["chroma"] < 3, f"a gray drawing has colour: {gray}"

    page.click("label[for=mode-color]")
    color = _drawing_stats(page, "s.chroma > 15")  # waits for it: a coloured drawing, chroma > 15
    assert color["chroma"] > 15 and color["width"] > 0, color
    assert sent[-1] == {"type": "options", "options": {**sent[-1]["options"], "mode": "color"}}, sent
    _shot_also(page, "browser-live-color.png", selector="#live-view")

    page.select_option("#max_side", "")  # "Original size": "" puts max_side back to its default, none
    page.wait_for_function("document.querySelector('#live-drawing').naturalWidth === 1280", timeout=RENDER_TIMEOUT_MS)
    assert sent[-1]["options"]["max_side"] == ""
    assert page.is_hidden("#live-error"), page.inner_text("#live-error")

    light = _drawing_stats(page)
    page.focus("#tone_gamma")
    page.keyboard.press("End")  # 1 -> 4
    _drawing_stats(page, "s.mean < arg - 10", light["mean"])
    assert sent[-1]["options"]["tone_gamma"] == 4
    # a slider dragged through many values sends a few messages, not one per value
    before = len(sent)
    page.focus("#stroke_width")
    for _ in range(4):
        page.keyboard.press("ArrowRight")
    page.wait_for_timeout(600)
    assert 1 <= len(sent) - before <= 3, sent[before:]  # debounced: fewer than the 4 presses
    assert sent[-1]["options"]["stroke_width"] == 5
    _wait_for_frames(page, 2)
    assert page.is_hidden("#live-error"), page.inner_text("#live-error")
    assert not live_errors, live_errors


def test_live_keeps_what_the_user_chose_on_the_cpu(server, live_page, live_errors):
    """The CPU backend's Live defaults go only in fields the user left alone."""
    page = live_page
    base, health = server
    if health["backend"] != "cpu":
        pytest.skip("the Live view's CPU defaults apply on the CPU backend")
    page.goto(f"{base}/")
    page.select_option("#max_side", "2048")  # chosen in the Sketch view: kept
    page.get_by_role("link", name="Live", exact=True).click()
    assert page.input_value("#max_side") == "2048"
    assert page.is_checked("#texture-fast")  # left alone: the CPU's live default
    page.click("label[for=texture-lu]")  # chosen in the Live view: kept on leaving it
    page.get_by_role("link", name="Sketch", exact=True).click()
    assert page.is_checked("#texture-lu") and page.input_value("#max_side") == "2048"
    page.get_by_role("link", name="Live", exact=True).click()
    assert page.is_checked("#texture-lu"), "a value the user chose is not replaced"
    assert not live_errors, live_errors


# Arrival times (ms) of drawings every `interval`, the last at 100 s, and the rate read `after` it.
FRAME_RATE = """([interval, count, after]) => {
  const times = Array.from({ length: count }, (_, i) => 100000 - (count - 1 - i) * interval);
  return window.pencil.frameRate(times, 100000 + after);
}"""


@pytest.mark.parametrize(
    ("interval_ms", "count", "after_ms", "low", "high"),
    [
        (33.3, 300, 10, 29.5, 30.5),  # a GPU at 30 fps
        (1400, 8, 100, 0.6, 0.75),  # a CPU at 0.7 fps: a 2 s window held one drawing or none
        (3000, 5, 500, 0.3, 0.42),  # slower than the old 2 s window: it read 0.0 fps
        (2000, 5, 15_000, 0.0, 0.1),  # the drawings stopped: the rate falls to 0
        (33.3, 2, 5, 25, 35),  # the first two drawings
    ],
)
def test_the_frame_rate_tile_counts_slow_backends_honestly(server, web_page, interval_ms, count, after_ms, low, high):
    page = web_page
    base, _ = server
    page.goto(f"{base}/#live")
    rate = page.evaluate(FRAME_RATE, [interval_ms, count, after_ms])
    assert low <= rate <= high, rate


def test_live_snapshot_downloads_a_jpeg(server, live_page, live_errors, tmp_path):
    import re

    page = live_page
    base, _ = server
    _start_live(page, base, "texture-fast")
    with page.expect_download() as download:
        page.get_by_role("button", name="Snapshot").click()
    name = download.value.suggested_filename
    assert re.fullmatch(r"live-sketch-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.jpg", name), name
    saved = tmp_path / name
    download.value.save_as(saved)
    with Image.open(saved) as image:
        assert image.format == "JPEG" and image.size == (640, 360)  # the CPU backend's Live size
    assert name in page.inner_text("#live-status")
    assert not live_errors, live_errors


def test_closing_the_tab_frees_the_live_session(server, camera_browser, live_errors):
    page_base, _ = server
    _wait_for_sessions(page_base, 0)
    context = _camera_context(camera_browser, live_errors)
    try:
        page = context.new_page()
        _start_live(page, page_base, "texture-fast")
        assert _live_sessions(page_base) == (1, 1)
        page.close()
        _wait_for_sessions(page_base, 0)
    finally:
        context.close()
    assert not live_errors, live_errors


def test_leaving_the_live_view_stops_the_camera(server, live_page, live_errors):
    """The Sketch tab, or the page hidden: the connection closes and the camera turns off."""
    page = live_page
    base, _ = server
    _wait_for_sessions(base, 0)
    _start_live(page, base, "texture-fast")
    page.get_by_role("link", name="Sketch", exact=True).click()
    assert page.is_visible("#sketch-view") and page.is_hidden("#live-view")
    assert page.get_attribute(".tabs a[data-view=sketch]", "aria-current") == "page"
    page.wait_for_function(TRACKS_ENDED, timeout=5000)
    _wait_for_sessions(base, 0)
    page.go_back()  # Back returns to the Live view, stopped
    page.wait_for_selector("#live-view", state="visible")
    assert "you left the Live view" in page.inner_text("#live-status")
    assert page.get_by_role("button", name="Start camera").count() == 1

    page.click("#live-toggle")
    _wait_for_frames(page, 2)
    assert _live_sessions(base) == (1, 1)
    page.evaluate(
        """() => {
            Object.defineProperty(document, 'hidden', { value: true, configurable: true });
            Object.defineProperty(document, 'visibilityState', { value: 'hidden', configurable: true });
            document.dispatchEvent(new Event('visibilitychange'));
        }"""
    )
    page.wait_for_function(TRACKS_ENDED, arg=2, timeout=5000)
    _wait_for_sessions(base, 0)
    assert "hidden" in page.inner_text("#live-status")
    assert not live_errors, live_errors


def test_sketch_and_live_views_share_the_options(server, web_page, page_errors, photo):
    """The tabs switch views in place: the photo stays, an option chosen in the Live view is
    the Sketch view's too, and the photo is drawn again with it (once) on coming back."""
    page = web_page
    base, health = server
    page.add_init_script(RECORD_FORMS)
    page.goto(f"{base}/")
    page.set_input_files("#file", str(photo))
    _wait_for_sketch(page, health["backend"])
    assert page.is_disabled("#quality")  # PNG

    page.get_by_role("link", name="Live", exact=True).click()
    assert page.title() == "Pencil — live camera"
    assert page.is_hidden("#format-field") and page.is_enabled("#quality")
    page.click("label[for=mode-color]")
    page.click("label[for=hatching-follow]")
    page.wait_for_timeout(500)
    assert len(page.evaluate("window.__sketchForms")) == 1, "the Live view drew the photo"

    with page.expect_response(lambda r: _is_sketch_request(r.request), timeout=RENDER_TIMEOUT_MS) as again:
        page.get_by_role("link", name="Sketch", exact=True).click()
    assert again.value.ok
    assert page.url == f"{base}/" and page.is_visible("#sketch-view")
    _wait_for_sketch(page, health["backend"])
    page.wait_for_timeout(400)
    forms = page.evaluate("window.__sketchForms")
    assert len(forms) == 2 and forms[-1]["mode"] == "color" and forms[-1]["hatching"] == "follow", forms
    # what the Live view picked for the CPU backend was given back: the Sketch view's defaults
    assert forms[-1]["texture"] == "lu" and forms[-1]["max_side"] == "1024", forms
    assert page.is_visible("#format-field") and page.is_disabled("#quality")
    assert page.get_attribute("#original", "alt") == "Original photo: astronaut.jpg"
    assert not page_errors, page_errors


CAMERA_REFUSED = """
(name) => {
  navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('refused by the test', name));
}
"""


@pytest.mark.parametrize(
    ("error", "message"),
    [("NotAllowedError", "Camera permission was denied"), ("NotFoundError", "No camera was found")],
)
def test_live_says_when_there_is_no_camera(server, live_page, error, message):
    page = live_page
    base, _ = server
    page.goto(f"{base}/#live")
    page.evaluate(CAMERA_REFUSED, error)
    page.click("#live-toggle")
    page.wait_for_selector("#live-error", state="visible")
    assert page.inner_text("#live-error").startswith(message)
    assert page.get_attribute("#live-error", "role") == "alert"
    assert page.get_by_role("button", name="Start camera").count() == 1
    if error == "NotAllowedError":
        _shot_also(page, "browser-live-denied.png", full_page=False)


def test_live_says_when_the_server_refuses_the_options(server, live_page, live_errors):
    """An option out of range (forced past the slider's own bounds): mid-stream the server
    answers an error and keeps drawing with the previous options; at the start it closes with
    4422. Either way the page names the option."""
    page = live_page
    base, _ = server
    set_line_frac = (
        "(el, v) => { el.min = '0'; el.value = v; el.dispatchEvent(new Event('input', { bubbles: true })); }"
    )
    _start_live(page, base, "texture-fast")
    page.eval_on_selector("#line_frac", set_line_frac, "0.001")
    page.wait_for_selector("#live-error", state="visible", timeout=RENDER_TIMEOUT_MS)
    text = page.inner_text("#live-error")
    assert text.startswith("The server refused the options:") and "line_frac" in text, text
    _wait_for_frames(page, 2)  # still drawing
    page.eval_on_selector("#line_frac", set_line_frac, "0.05")
    page.wait_for_selector("#live-error", state="hidden", timeout=RENDER_TIMEOUT_MS)

    page.eval_on_selector("#line_frac", set_line_frac, "0.001")
    page.wait_for_selector("#live-error", state="visible", timeout=RENDER_TIMEOUT_MS)
    page.click("#live-toggle")  # stop, then start with the bad option in the URL
    page.wait_for_function(TRACKS_ENDED, timeout=5000)
    page.click("#live-toggle")
    page.wait_for_function(
        "document.querySelector('#live-error').textContent.startsWith('The server refused the options (')",
        timeout=RENDER_TIMEOUT_MS,
    )
    assert "line_frac" in page.inner_text("#live-error")
    assert page.get_by_role("button", name="Start camera").count() == 1
    page.wait_for_function(TRACKS_ENDED, arg=2, timeout=5000)
    assert not [e for e in live_errors if "pageerror" in e], live_errors


@pytest.fixture(scope="module")
def full_server(chromium_path, tmp_path_factory):
    """An app whose /live takes no session (PENCIL_MAX_LIVE_SESSIONS=0): every connection closes with 1013."""
    with live_server(tmp_path_factory.mktemp("live-full"), max_live_sessions="0") as base:
        yield base


def test_live_says_when_the_server_is_full(full_server, live_page):
    page = live_page
    page.goto(f"{full_server}/#live")
    page.click("#live-toggle")
    page.wait_for_selector("#live-error", state="visible", timeout=RENDER_TIMEOUT_MS)
    text = page.inner_text("#live-error")
    assert text.startswith("The server is drawing as many live cameras as it can") and "retry later" in text, text
    page.wait_for_function(TRACKS_ENDED, timeout=5000)
    assert page.get_by_role("button", name="Start camera").count() == 1


def test_live_says_when_the_connection_is_lost(server, live_page):
    """The connection drops mid-stream (here cut by the test between the page and the server)."""
    page = live_page
    base, _ = server
    routes = []

    def through(ws):
        routes.append((ws, ws.connect_to_server()))

    page.route_web_socket("**/live?*", through)
    _start_live(page, base, "texture-fast")
    to_page, to_server = routes[0]
    to_page.close(code=1011, reason="")
    to_server.close()
    page.wait_for_selector("#live-error", state="visible")
    assert page.inner_text("#live-error").startswith("The connection to the server was lost")
    page.wait_for_function(TRACKS_ENDED, timeout=5000)
    _wait_for_sessions(base, 0)


def test_live_phone_layout(server, camera_browser, live_errors):
    base, _ = server
    context = _camera_context(
        camera_browser,
        live_errors,
        viewport={"width": 375, "height": 800},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    try:
        page = context.new_page()
        _start_live(page, base, "texture-fast")
        scroll_width = page.evaluate("document.scrollingElement.scrollWidth")
        assert scroll_width <= 375 + 1, f"page is {scroll_width}px wide on a 375px screen"
        camera = page.locator("#live-video").bounding_box()
        drawing = page.locator("#live-drawing").bounding_box()
        assert camera and drawing and drawing["y"] >= camera["y"] + camera["height"] - 1  # stacked
        assert drawing["width"] > 300
        _shot_also(page, "browser-live-phone.png")
    finally:
        context.close()
    assert not live_errors, live_errors


# ------------------------------------------------- another site's page: CORS, keys, rates --
#
# A page served by a second server (a different port, so another origin) calls the API with
# fetch and opens /live, as a web app of another site would. The API server lists the page's
# origin in PENCIL_CORS_ORIGINS when the page is served as http://localhost:PORT; the same
# page reached as http://127.0.0.1:PORT is another origin, not on the list.

API_KEY_A, API_KEY_B = "browser-key-alice-0123456789", "browser-key-bob-0123456789ab"

# Draw a small picture, POST it to /sketch with the key given (or none); what the page can read.
PAGE_SKETCH = """async ([api, key]) => {
  const canvas = document.createElement('canvas');
  canvas.width = 96; canvas.height = 64;
  const g = canvas.getContext('2d');
  g.fillStyle = '#8ab'; g.fillRect(0, 0, 96, 64); g.fillStyle = '#234'; g.fillRect(20, 10, 40, 30);
  const blob = await new Promise((done) => canvas.toBlob(done, 'image/jpeg', 0.9));
  const form = new FormData();
  form.append('image', blob, 'page.jpg');
  const headers = key ? { Authorization: 'Bearer ' + key } : {};
  try {
    const res = await fetch(api + '/sketch', { method: 'POST', body: form, headers });
    const type = res.headers.get('content-type') || '';
    return { status: res.status, size: res.headers.get('x-image-size'), retryAfter: res.headers.get('retry-after'),
             body: type.startsWith('application/json') ? await res.json() : (await res.blob()).size };
  } catch (err) {
    return { failed: String(err) };
  }
}"""

# Open /live (with the protocols given), wait for its first message or its end.
PAGE_LIVE = """([url, protocols]) => new Promise((done) => {
  const ws = protocols ? new WebSocket(url, protocols) : new WebSocket(url);
  ws.onmessage = (e) => { done({ opened: true, protocol: ws.protocol, first: JSON.parse(e.data).type }); ws.close(); };
  ws.onclose = (e) => done({ opened: false, code: e.code });
})"""


@pytest.fixture(scope="module")
def other_site():
    """A second web server on a free port, whose every page is an empty HTML document; its port."""
    import http.server
    import threading

    class Blank(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><title>another site</title><p>another site's page</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blank)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def keyed_server(chromium_path, tmp_path_factory, other_site):
    """The app with API keys, a rate limit and CORS for http://localhost:<other_site>; (base
    URL, its log file)."""
    workdir = tmp_path_factory.mktemp("keyed")
    with live_server(
        workdir,
        cors_origins=f"http://localhost:{other_site}",
        api_keys=f"alice:{API_KEY_A},bob:{API_KEY_B}",
        rate_limit="0.02",  # a token every 50 s: each key has its burst, then waits
        rate_limit_burst="3",
    ) as base:
        yield base, workdir / "server.log"


def test_a_listed_sites_page_draws_and_goes_live_with_a_key(keyed_server, other_site, web_page, page_errors):
    base, log = keyed_server
    page = web_page
    page.goto(f"http://localhost:{other_site}/")
    live = base.replace("http://", "ws://") + "/live"

    drawn = page.evaluate(PAGE_SKETCH, [base, API_KEY_A])
    assert drawn["status"] == 200 and drawn["size"] == "96x64" and drawn["body"] > 0, drawn
    without = page.evaluate(PAGE_SKETCH, [base, None])
    assert without["status"] == 401 and without["body"]["error"] == "unauthorized", without  # readable: CORS on the 401

    opened = page.evaluate(PAGE_LIVE, [live, ["pencil", f"pencil-key.{API_KEY_A}"]])
    assert opened == {"opened": True, "protocol": "pencil", "first": "ready"}, opened
    in_url = page.evaluate(PAGE_LIVE, [f"{live}?api_key={API_KEY_A}&texture=fast", None])
    assert in_url["opened"], in_url
    refused = page.evaluate(PAGE_LIVE, [live, None])  # no key: the handshake's 401
    assert refused == {"opened": False, "code": 1006}, refused

    # alice has used her burst of 3 (a drawing, two live sessions; the 401 took none): the next waits,
    # and the page can read when to come back; bob's bucket is his own.
    limited = page.evaluate(PAGE_SKETCH, [base, API_KEY_A])
    assert limited["status"] == 429 and limited["body"]["error"] == "rate_limited", limited
    assert 1 <= int(limited["retryAfter"]) <= 50, limited
    assert page.evaluate(PAGE_SKETCH, [base, API_KEY_B])["status"] == 200

    text = log.read_text()
    assert "WebSocket /live" in text, "the server logged no handshake: the test would prove nothing"
    assert API_KEY_A not in text and API_KEY_B not in text
    assert not page_errors, page_errors


def test_an_unlisted_sites_page_is_refused(keyed_server, other_site, web_page):
    base, _ = keyed_server
    page = web_page
    page.goto(f"http://127.0.0.1:{other_site}/")  # the same page as another origin, off the list
    refused = page.evaluate(PAGE_SKETCH, [base, API_KEY_B])
    assert "failed" in refused, refused  # the preflight is refused: fetch fails, nothing is read
    live = base.replace("http://", "ws://") + "/live"
    assert page.evaluate(PAGE_LIVE, [live, ["pencil", f"pencil-key.{API_KEY_B}"]]) == {"opened": False, "code": 1006}
    plain = httpx.options(
        f"{base}/sketch",
        headers={"Origin": f"http://127.0.0.1:{other_site}", "Access-Control-Request-Method": "POST"},
    )
    assert plain.status_code == 400 and plain.json()["error"] == "cors_refused"
