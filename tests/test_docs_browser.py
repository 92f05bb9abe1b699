"""The documentation site in a real browser: build it (``mkdocs build --strict``), serve it on
127.0.0.1 (a free port), and open it with headless Chromium.

- the home page renders with the site's title and the README's sections;
- an algorithm page (FLIU, generated from its module) renders its options table and its
  formulas (KaTeX, served by the site);
- the cpu suite's leaderboard page renders its table, and its figures are served;
- the search (Material's client-side search, a web worker over ``search/search_index.json``)
  finds a page: the test drives Chromium over its DevTools protocol, opens ``/?q=<word>`` and
  waits for a search hit.

Screenshots of the three go to the test's temporary folder and are copied to
``$PFLOWER_DOCS_SHOTS`` (default ``/tmp/docs_shots``). Skipped, saying why, where Chromium is
missing (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"
    ),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]


@pytest.fixture(scope="module")
def site(docs_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("shots")
    handler = functools.partial(_QuietHandler, directory=str(docs_site))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", out
    finally:
        server.shutdown()
        server.server_close()
        shots = Path(os.environ.get("PFLOWER_DOCS_SHOTS", "/tmp/docs_shots"))
        shots.mkdir(parents=True, exist_ok=True)
        for png in out.glob("*.png"):
            shutil.copy(png, shots / png.name)


class _QuietServer(http.server.ThreadingHTTPServer):
    """Chromium may close a connection before a file is sent in full (it had what it needed):
    no error of the site, so not printed as one."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _chromium(*args: str, cwd: Path) -> str:
    assert CHROMIUM is not None
    result = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={cwd / 'profile'}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _open(url: str, out: Path, shot: str) -> str:
    """The page's DOM after load, and a screenshot of it as ``out/shot``."""
    _chromium("--window-size=1280,1600", f"--screenshot={out / shot}", url, cwd=out)
    assert (out / shot).stat().st_size > 10_000
    return _chromium("--virtual-time-budget=5000", "--dump-dom", url, cwd=out)


def test_home_page_renders(site: tuple[str, Path]) -> None:
    url, out = site
    dom = _open(url + "/", out, "home.png")
    assert "<title>pflower</title>" in dom
    assert "Install, run, test" in dom and "Reproductions" in dom
    assert 'href="algorithms/fliu/"' in dom  # README's module links became site links


def test_algorithm_page_renders_its_options_table(site: tuple[str, Path]) -> None:
    url, out = site
    dom = _open(url + "/algorithms/fliu/", out, "algorithm_fliu.png")
    assert "<title>FLIU - pflower</title>" in dom
    assert "Options of <code>strategy=fliu</code>" in dom
    assert "<code>strategy.gamma</code>" in dom and "<th>allowed</th>" in dom
    # the module docstring's formulas, typeset by the site's own KaTeX (Eq. 3 displayed)
    assert 'class="katex-display"' in dom and 'class="katex"' in dom
    assert "katex-error" not in dom


def test_partition_gallery_shows_every_scheme_with_its_heatmap(
    site: tuple[str, Path], docs_site: Path
) -> None:
    from pflower.blocks import blocks

    url, out = site
    dom = _open(url + "/datasets/gallery/", out, "partition_gallery.png")
    assert "<title>Partition gallery - pflower</title>" in dom
    for name in set(blocks("partition")) - {"from_file", "natural"}:
        assert f'src="../../images/partitions/{name}.png"' in dom, name
    assert (docs_site / "images" / "partitions" / "lsqs.png").is_file()


def test_leaderboard_page_renders_its_table_and_figures(site: tuple[str, Path]) -> None:
    url, out = site
    page = url + "/leaderboard/cpu/"
    dom = _open(page, out, "leaderboard_cpu.png")
    assert "<title>Suite cpu - pflower</title>" in dom
    assert "<th>rank</th>" in dom and "fmnist_dir01" in dom
    figures = re.findall(r'<img[^>]*src="([^"]*leaderboard_[^"]+\.png)"', dom)
    assert figures
    for figure in figures:  # each served as an image
        with urllib.request.urlopen(urllib.parse.urljoin(page, figure)) as response:
            assert response.status == 200 and response.headers["Content-Type"] == "image/png"


def test_search_finds_a_page(site: tuple[str, Path]) -> None:
    websockets_sync = pytest.importorskip("websockets.sync.client")
    url, out = site
    assert CHROMIUM is not None
    browser = subprocess.Popen(
        [
            CHROMIUM,
            *FLAGS,
            "--window-size=1280,900",
            "--remote-debugging-port=0",
            f"--user-data-dir={out / 'cdp-profile'}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = out / "cdp-profile" / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=30))
        page = next(t for t in targets if t["type"] == "page")
        with websockets_sync.connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
            calls = iter(range(1, 10_000))

            def call(method: str, **params: object) -> dict:
                ident = next(calls)
                ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv(timeout=60))
                    if message.get("id") == ident:
                        assert "error" not in message, message
                        return message["result"]

            call("Page.enable")
            call("Page.navigate", url=url + "/?q=proximal")
            hits: list[str] = []
            deadline = time.monotonic() + 90
            while not hits and time.monotonic() < deadline:
                time.sleep(0.5)
                result = call(
                    "Runtime.evaluate",
                    expression="JSON.stringify([...document.querySelectorAll("
                    "'.md-search-result__item')].map(e => e.textContent.trim().slice(0, 80)))",
                    returnByValue=True,
                )
                hits = json.loads(result["result"].get("value") or "[]")
            shot = call("Page.captureScreenshot", format="png")
            (out / "search.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.terminate()
        browser.wait(timeout=30)
    assert hits, "the search for 'proximal' showed no result"
    assert any("FedProx" in hit or "proximal" in hit.lower() for hit in hits), hits
