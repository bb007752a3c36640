"""Drive the web page in a headless Chromium against a live server.

Needs a system Chromium (Debian's ``chromium`` package) and the ``playwright``
Python package; the browser bundled by ``playwright install`` is never used.
Screenshots land in ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

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
def chromium_browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


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
    assert page.input_value("#json-kind") == "search"
    body = json.loads(page.input_value("#json-body"))
    assert len(body["corpus_id"]) == 32 and "text" not in body
    body["patterns"] = ["better", "aa"]
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


def _offline(page, base: str) -> list[tuple[str, str]]:
    """Abort every request to another host than the server's; (resource type, URL) of those aborted."""
    host = httpx.URL(base).host
    blocked: list[tuple[str, str]] = []

    def route(r):
        if httpx.URL(r.request.url).host in (host, "localhost"):
            r.continue_()
        else:
            blocked.append((r.request.resource_type, r.request.url))
            r.abort()

    page.route("**/*", route)
    return blocked


def test_swagger_ui_renders_offline(server, web_page, page_errors):
    page = web_page
    base, _ = server
    blocked = _offline(page, base)
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
    assert blocked == [], blocked
    assert not page_errors, page_errors


def test_redoc_renders_offline(server, web_page, page_errors):
    page = web_page
    base, _ = server
    blocked = _offline(page, base)
    page.goto(f"{base}/redoc")
    page.wait_for_selector(".api-content h1", timeout=RENDER_TIMEOUT_MS)
    assert "pencil-gpu" in page.inner_text(".api-content h1")
    menu = page.inner_text(".menu-content")
    assert all(tag in menu.lower() for tag in ("sketch", "jobs", "corpora", "operations")), menu
    assert "adminToken" in page.inner_text(".api-content")  # the Authentication section
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-redoc-offline.png"))  # the viewport: the whole page is very long
    # only ReDoc's "API docs by Redocly" logo comes from elsewhere; it hides itself when it fails
    assert all(kind == "image" and "redoc.ly/" in url for kind, url in blocked), blocked
    assert not page_errors, page_errors
