"""`traceml ui` as a user runs it: a real process on a real loopback socket."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from traceml_ai.runs.fake import generate


def _start(root: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", "0", "--no-browser", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)", line)
    assert match, line + (proc.stderr.read() if proc.poll() is not None else "")
    return proc, match.group(1)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=240)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    generate(tmp_path / "traceml" / "runs", runs=24, seed=0)
    return tmp_path / "traceml" / "runs"


def test_ui_serves_on_loopback_with_a_token_and_saves_its_cache(root: Path) -> None:
    proc, url = _start(root)
    try:
        base = url.split("/?")[0]
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(base + "/api/runs", timeout=10)
        assert denied.value.code == 403
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(url, timeout=10)  # 303 to "/", the cookie set on the way
        assert page.status == 200 and "text/html" in page.headers["content-type"]
        assert "content-security-policy" in {k.lower() for k in page.headers}
        body = json.loads(opener.open(base + "/api/runs", timeout=10).read())
        assert len(body["runs"]) == 24
        events = opener.open(base + "/api/events", timeout=10)  # a page connected: polling starts
        assert events.readline().startswith(b"event: hello")
        events.close()
    finally:
        assert _stop(proc) == 0
    assert (root.parent / ".cache" / "runs.sqlite").exists()  # written on the way out


def test_ui_starts_from_the_run_database_on_a_second_start(root: Path) -> None:
    proc, _ = _start(root)
    _stop(proc)
    proc, url = _start(root)
    try:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(url, timeout=10)
        body = json.loads(opener.open(url.split("/?")[0] + "/api/runs", timeout=10).read())
        assert len(body["runs"]) == 24
    finally:
        _stop(proc)


def test_ui_without_any_runs_folder_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "traceml_ai", "ui", str(tmp_path / "nope"), "--no-browser"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1 and proc.stderr.startswith("error: no runs folder found")


def test_demo_ends_by_serving_the_viewer_on_its_workspace(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "demo", "--workspace", str(tmp_path / "ws"), "--epochs", "2",
         "--fake-runs", "4", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    url = None
    for line in proc.stdout:
        match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)", line)
        if match:
            url = match.group(1)
            break
    try:
        assert url, proc.stderr.read() if proc.stderr else ""
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        opener.open(url, timeout=10)
        body = json.loads(opener.open(url.split("/?")[0] + "/api/runs", timeout=10).read())
        names = {r["name"] for r in body["runs"]}
        assert {"digits-mlp", "digits-mlp-wide", "baseline", "failed-run"} <= names
    finally:
        assert _stop(proc) == 0


def test_ui_refuses_a_cache_folder_inside_any_root(tmp_path: Path) -> None:
    generate(tmp_path / "proj" / "runs", runs=2, seed=0)
    # A cache folder given inside the second root (proj) is refused before anything is written.
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_ai", "ui", str(tmp_path / "proj" / "runs"), str(tmp_path / "proj"),
         "--cache-dir", str(tmp_path / "proj" / ".cache"), "--no-browser"], capture_output=True, text=True,
        timeout=240,
    )
    assert proc.returncode == 1 and "inside the runs folder" in proc.stderr
    assert not (tmp_path / "proj" / ".cache").exists()


def test_ctrl_c_stops_the_viewer_while_a_page_holds_its_event_stream(root: Path) -> None:
    proc, url = _start(root)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    opener.open(url, timeout=10).read()
    events = opener.open(url.split("/?")[0] + "/api/events", timeout=30)  # an open page's stream
    assert events.readline().startswith(b"event: hello")
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=15)  # it used to wait for the page to go away (forever)
    finally:
        events.close()
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    assert proc.stderr is not None
    errors = proc.stderr.read()
    assert "Traceback" not in errors and "ERROR" not in errors  # the stream ended, it was not cancelled
    assert (root.parent / ".cache" / "runs.sqlite").exists()  # still saved on the way out
