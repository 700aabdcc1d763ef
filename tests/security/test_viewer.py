"""The viewer's guard against everything that is not its own page (issue 12 points 8 and 10,
issue 17 point 1): every way in with a wrong, empty or partial token, the Host header, the
redirect, other pages on other 127.0.0.1 ports, and request lines a parser cannot take."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer

TOKEN = "Sec-Token-0123456789abcdefABCDEF"
HOST = "127.0.0.1:8765"
ORIGIN = f"http://{HOST}"
COOKIE = "traceml_token_8765"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("viewer")
    generate(base / "runs", runs=6, seed=3)
    return base


@pytest.fixture()
def viewer(workspace: Path, tmp_path: Path) -> Viewer:
    root = workspace / "runs"
    view = Viewer(RunStore([root]), CacheFolder(tmp_path / "cache", roots=[root]), refresh_interval_seconds=0.2)
    view.poll()
    return view


def client_for(viewer: Viewer) -> TestClient:
    app = create_app(viewer, TOKEN, lambda: {HOST, "localhost:8765"})
    return TestClient(app, base_url=f"http://{HOST}")


# -- every way in (issue 17 point 1) -----------------------------------------------------------------

WRONG_TOKENS = ["wrong", "", TOKEN[:-1], TOKEN[:8], TOKEN + "x", TOKEN.lower(), TOKEN + "\x00"]


@pytest.mark.parametrize("given", WRONG_TOKENS, ids=["wrong", "empty", "prefix-1", "prefix-8", "longer", "case",
                                                     "nul"])
def test_a_wrong_empty_or_partial_token_opens_no_way_in(viewer: Viewer, given: str) -> None:
    client = client_for(viewer)
    # ?token= on the page: no redirect, no cookie handed out.
    page = client.get("/", params={"token": given}, follow_redirects=False)
    assert page.status_code == 403 and "set-cookie" not in page.headers
    # ?token= on the API, the header, the cookie of this viewer's port.
    assert client.get("/api/runs", params={"token": given}).status_code == 403
    assert client.get("/api/runs", headers={"x-traceml-token": given}).status_code == 403
    if "\x00" not in given:  # not a valid cookie value at all
        client.cookies.set(COOKIE, given)
    assert client.get("/api/runs").status_code == 403
    assert client.get("/static/app.js").status_code == 403


def test_the_right_token_opens_each_way_in(viewer: Viewer) -> None:
    client = client_for(viewer)
    assert client.get("/api/runs", params={"token": TOKEN}).status_code == 200
    assert client.get("/api/runs", headers={"x-traceml-token": TOKEN}).status_code == 200
    visit = client.get("/", params={"token": TOKEN, "view": "charts"}, follow_redirects=False)
    assert visit.status_code == 303 and visit.headers["location"] == "/?view=charts"
    cookie = visit.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert client.get("/api/runs").status_code == 200  # the cookie alone


def test_the_cookie_of_another_port_is_not_this_viewers(viewer: Viewer) -> None:
    """Cookies ignore ports: a second viewer on :9999 sets traceml_token_9999; it neither opens nor
    breaks this one."""
    client = client_for(viewer)
    client.cookies.set("traceml_token_9999", TOKEN)
    assert client.get("/api/runs").status_code == 403
    client.cookies.set(COOKIE, TOKEN)
    client.cookies.set("traceml_token_9999", "the-other-viewers-token-xxxxxxxx")
    assert client.get("/api/runs").status_code == 200


@pytest.mark.parametrize("host", ["", "evil.example:8765", "127.0.0.1:9999", "127.0.0.1"])
def test_a_request_not_addressed_to_this_viewer_is_refused_even_with_the_token(viewer: Viewer, host: str) -> None:
    client = client_for(viewer)
    response = client.get("/api/runs", headers={"x-traceml-token": TOKEN, "host": host})
    assert response.status_code == 403


@pytest.mark.parametrize(("path", "location"), [
    ("//evil.example/", "/evil.example/"),
    ("///evil.example/x", "/evil.example/x"),
    ("/\\evil.example/", "/evil.example/"),
    ("/runs", "/runs"),
])
def test_the_redirect_goes_only_to_a_path_on_this_server(viewer: Viewer, path: str, location: str) -> None:
    client = client_for(viewer)
    response = client.get(f"http://{HOST}{path}?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == location
    assert not response.headers["location"].startswith(("//", "/\\"))


# -- other pages in the same browser (issue 12 point 10) --------------------------------------------


def test_a_page_on_another_local_port_cannot_hide_a_run_or_write_an_export(viewer: Viewer, tmp_path: Path) -> None:
    """What Chromium sends for a fetch() from http://127.0.0.1:9999 with credentials: the cookie
    (same site), ``Origin: http://127.0.0.1:9999``, ``Sec-Fetch-Site: same-site``."""
    cache_dir = tmp_path / "cache"
    client = client_for(viewer)
    client.cookies.set(COOKIE, TOKEN)
    keys = [r.key for r in viewer.store.runs()]
    other = {"origin": "http://127.0.0.1:9999", "sec-fetch-site": "same-site", "sec-fetch-mode": "cors"}
    assert client.post("/api/hide", json={"keys": keys[:1], "hidden": True}, headers=other).status_code == 403
    assert client.post("/api/export/table", json={"keys": keys, "columns": []}, headers=other).status_code == 403
    # Without Origin (an older browser, a form): still refused when only the cookie authorises.
    assert client.post("/api/hide", json={"keys": keys[:1], "hidden": True},
                       headers={"sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors"}).status_code == 403
    assert client.post("/api/hide", json={"keys": keys[:1], "hidden": True}).status_code == 403
    # A form post (text/plain: no preflight) with this viewer's own Origin forged is still refused.
    form = client.post("/api/hide", content=b'{"keys": [], "hidden": true}',
                       headers={"origin": ORIGIN, "content-type": "text/plain"})
    assert form.status_code == 415
    assert viewer.hidden == set()
    assert not list(cache_dir.rglob("*.csv"))  # no export was written
    # Reading is refused too: the page of another port gets no data even where CORS would hide it.
    assert client.get("/api/runs", headers=other).status_code == 403
    # This viewer's own page (same origin) does all of it.
    own = {"origin": ORIGIN, "sec-fetch-site": "same-origin", "sec-fetch-mode": "cors"}
    assert client.post("/api/hide", json={"keys": keys[:1], "hidden": True}, headers=own).status_code == 200
    assert client.post("/api/export/table", json={"keys": keys, "columns": []}, headers=own).status_code == 200
    assert viewer.hidden == {keys[0]} and len(list(cache_dir.rglob("*.csv"))) == 2  # table-….csv, latest.csv


def test_a_link_from_another_site_still_opens_the_viewer(viewer: Viewer) -> None:
    """A top-level navigation (the user clicks the printed URL in another page) is not a forgery."""
    client = client_for(viewer)
    response = client.get("/", params={"token": TOKEN}, follow_redirects=False,
                          headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})
    assert response.status_code == 303


# -- requests a parser cannot take (issue 12 point 8) -------------------------------------------------


@pytest.fixture(scope="module")
def served(workspace: Path) -> Iterator[tuple[int, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(workspace / "runs"), "--port", "0", "--no-browser",
         "--cache-dir", str(workspace / "served-cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", line)
    assert match, line
    try:
        yield int(match.group(1)), match.group(2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("path", [b"/api/runs\x00x", b"/api/runs\rx", b"/a\r\nX-Evil: 1", b"/%00", b"/api/run%0d%0a"])
def test_a_control_character_in_the_path_gets_an_answer_not_a_dropped_connection(
        served: tuple[int, str], path: bytes) -> None:
    port, token = served
    answer = raw_request(port, b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-TraceML-Token: %s\r\n"
                         b"Connection: close\r\n\r\n" % (port, token.encode()))
    status = answer.split(b"\r\n", 1)[0]
    assert re.match(rb"HTTP/1\.1 40[04] ", status), answer[:200]


def test_an_unknown_export_column_is_a_400_that_names_it(viewer: Viewer) -> None:
    client = client_for(viewer)
    keys = [r.key for r in viewer.store.runs()]
    response = client.post("/api/export/table", json={"keys": keys, "columns": ["no.such.column"]},
                           headers={"x-traceml-token": TOKEN})
    assert response.status_code == 400 and "no.such.column" in response.json()["error"]


@pytest.mark.parametrize("path", ["/static/%00", "/static/app.js%0d%0aX-Evil:%201", "/api/attachments/%00"])
def test_a_decoded_control_character_in_the_path_is_a_400(viewer: Viewer, path: str) -> None:
    client = client_for(viewer)
    response = client.get(path, headers={"x-traceml-token": TOKEN})
    assert response.status_code == 400 and "x-evil" not in response.headers


def test_a_huge_declared_body_is_refused_before_it_is_read(served: tuple[int, str]) -> None:
    """A token holder announcing a 100 GB body gets a 400 at once; the viewer does not wait for (or
    hold) the body, and the connection is answered rather than left hanging."""
    port, token = served
    answer = raw_request(port, b"POST /api/refresh HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-TraceML-Token: %s\r\n"
                         b"Origin: http://127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 99999999999\r\nConnection: close\r\n\r\n{"
                         % (port, token.encode(), port))
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"too large" in rest


def test_a_body_that_runs_past_the_limit_is_refused(viewer: Viewer) -> None:
    from traceml_ai.ui.api import MAX_BODY_BYTES

    client = client_for(viewer)
    big = b'{"keys": ["' + b"x" * (MAX_BODY_BYTES + 10) + b'"]}'
    answer = client.post("/api/refresh", content=big, headers={
        "x-traceml-token": TOKEN, "origin": ORIGIN, "content-type": "application/json"})
    assert answer.status_code == 400 and "too large" in answer.json()["error"]


def test_the_csv_export_of_a_table_whose_keys_pass_one_mib_is_written(viewer: Viewer) -> None:
    """Review 16a: the page's Export CSV of all rows sends every run's key (its folder path); past
    about 13,000 rows that was over the 1 MiB body limit and the export was refused. A request that
    lists run keys may be up to MAX_KEYS_BODY_BYTES; other requests keep the 1 MiB limit."""
    from traceml_ai.ui.api import MAX_BODY_BYTES, MAX_KEYS_BODY_BYTES

    client = client_for(viewer)
    headers = {"x-traceml-token": TOKEN, "origin": ORIGIN, "content-type": "application/json"}
    runs = [r.key for r in viewer.store.runs()]
    keys = (runs * (MAX_BODY_BYTES // sum(len(k) + 3 for k in runs) + 2))[:20_000]
    body = json.dumps({"keys": keys, "columns": ["name"]}).encode()
    assert len(body) > MAX_BODY_BYTES
    answer = client.post("/api/export/table", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["rows"] == len(keys)
    written = Path(answer.json()["path"]).read_text().splitlines()
    assert len(written) == len(keys) + 1  # the header, then a row per key
    too_big = client.post("/api/export/table", content=b"{}", headers={
        **headers, "content-length": str(MAX_KEYS_BODY_BYTES + 1)})
    assert too_big.status_code == 400 and f"at most {MAX_KEYS_BODY_BYTES} bytes" in too_big.json()["error"]


def test_a_wrong_token_beside_a_right_one_is_refused(viewer: Viewer) -> None:
    """Whatever order or way they come in, one wrong token refuses the request (a reviewer found
    ``?token=bad&token=GOOD`` and a valid cookie with a wrong header let through)."""
    client = client_for(viewer)
    assert client.get(f"/api/runs?token=bad&token={TOKEN}").status_code == 403
    assert client.get(f"/api/runs?token={TOKEN}&token=bad").status_code == 403
    assert client.get(f"/api/runs?token={TOKEN}").status_code == 200
    client.cookies.set(COOKIE, TOKEN)
    assert client.get("/api/runs").status_code == 200
    assert client.get("/api/runs", headers={"x-traceml-token": "bad"}).status_code == 403
    assert client.get("/api/runs", headers={"x-traceml-token": TOKEN}).status_code == 200


@pytest.mark.parametrize("order", [("bad", TOKEN), (TOKEN, "bad")])
def test_a_repeated_token_header_with_one_wrong_value_is_refused(viewer: Viewer, order: tuple[str, str]) -> None:
    """Two ``X-TraceML-Token`` headers, one of them wrong: refused whichever comes first (one
    parser used to keep only the last, another only the first)."""
    client = client_for(viewer)
    headers = [("x-traceml-token", order[0]), ("x-traceml-token", order[1])]
    assert client.get("/api/runs", headers=headers).status_code == 403
    assert client.get("/api/runs", headers=[("x-traceml-token", TOKEN)] * 2).status_code == 200
