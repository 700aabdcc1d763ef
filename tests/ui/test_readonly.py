"""The viewer never writes inside a runs root (003 seed, "Security and resource use"; DESIGN §2.1).

Two checks: a full session driven through the API with every file under the root hashed before and
after, while a Python audit hook records every file the process opens for writing; and a source scan
that fails when a viewer module other than the cache writer gains a way to write files.
"""

from __future__ import annotations

import ast
import hashlib
import sys
import threading
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from traceml_ai.runs.fake import generate, live_run
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer

SRC = Path(__file__).resolve().parents[2] / "src" / "traceml_ai"
_WRITES: list[tuple[str, str]] = []
_RECORDING = threading.Event()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _RECORDING.is_set():
        path, mode = args[0], args[1]
        if isinstance(path, (str, bytes)) and isinstance(mode, str) and any(c in mode for c in "wax+"):
            _WRITES.append((str(path), mode))
    elif event in ("os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir", "os.mkdir") and _RECORDING.is_set():
        _WRITES.append((str(args[0]), event))


sys.addaudithook(_audit)  # cannot be removed; it records only while _RECORDING is set


def _hashes(root: Path, skip: Path | None = None) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and (skip is None or skip not in path.parents):
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def test_a_full_session_leaves_the_runs_root_byte_for_byte_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    cache = tmp_path / "traceml" / ".cache"
    generate(root, runs=24, seed=0)
    stop = threading.Event()
    live: dict[str, Path] = {}
    started = threading.Event()
    def write_live() -> None:
        live["dir"] = live_run(root, interval=0.05, stop=stop, on_epoch=lambda epoch: started.set())

    writer = threading.Thread(target=write_live)
    writer.start()
    assert started.wait(10)
    live_dir = next(p for p in root.iterdir() if "live-run" in p.name)
    before = _hashes(root, skip=live_dir)

    store = RunStore([root])
    viewer = Viewer(store, CacheFolder(cache, roots=[root]), refresh_interval_seconds=0.05)
    client = TestClient(create_app(viewer, "t", lambda: {"127.0.0.1:1"}), base_url="http://127.0.0.1:1")
    client.headers["x-traceml-token"] = "t"
    _RECORDING.set()
    try:
        viewer.start()
        viewer.poll()
        runs = client.get("/api/runs").json()["runs"]
        keys = [r["key"] for r in runs]
        client.get("/api/table", params=[("filter", "run.best.val/auc>=0.5"), ("sort", "-started"),
                                         ("group", "config.data.dataset"), ("search", "res")])
        client.post("/api/series", json={"keys": keys[:30], "metrics": ["val/auc", "train/loss"], "ema": 0.6})
        for r in runs:
            client.get("/api/run", params={"key": r["key"]})
            for name in ("run.json", "params.yaml", "config.json", "metrics.jsonl", "metrics.json"):
                client.get("/api/file", params={"key": r["key"], "name": name})
        client.post("/api/hide", json={"keys": keys[:2], "hidden": True})
        client.put("/api/ui-state", json={"view": "charts"})
        client.post("/api/export/table", json={"keys": keys, "columns": ["name", "run.best.val/auc"]})
        line = {"chart": "line", "keys": keys[:3], "metrics": ["val/auc"], "format": "csv"}
        bar = {"chart": "bar", "keys": keys, "field": "run.best.val/auc", "format": "png"}
        for spec in (line, bar):
            assert client.post("/api/export/chart", json=spec).status_code == 200
        client.post("/api/chart", json={"chart": "box", "keys": keys, "field": "run.best.val/auc",
                                        "group_by": "config.data.dataset"})
        for _ in range(3):
            client.post("/api/refresh", json={"since": 0})
        viewer.close()
    finally:
        _RECORDING.clear()
        stop.set()
        writer.join(10)
    assert _hashes(root, skip=live_dir) == before
    live_writes = [w for w in _WRITES if str(live_dir) in w[0]]
    viewer_writes = [w for w in _WRITES if w not in live_writes]
    outside = [w for w in viewer_writes if not w[0].startswith(str(cache))]
    assert not outside, f"the viewer wrote outside its cache folder: {outside[:5]}"
    assert (cache / "runs.sqlite").exists() and (cache / "exports" / "latest.csv").exists()


# Viewer modules that may write files, and why. Everything else the viewer imports only reads.
WRITERS = {
    "ui/cache.py": "the cache writer: ui-state, hidden runs, run database, exports, plots",
    "runs/rundb.py": "builds runs.sqlite at a temp path the cache writer gives it",
    "runs/writer.py": "the run-format writer of the logger and the fake-run generator (never the viewer)",
    "runs/fake.py": "the fake-run generator (a command of its own, never the viewer)",
}
WRITE_CALLS = {"write_text", "write_bytes", "replace", "rename", "unlink", "remove", "rmtree", "mkdir",
               "makedirs", "rmdir", "touch", "symlink", "chmod", "truncate", "connect"}


def _write_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "open" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            if any(c in str(node.args[1].value) for c in "wax+"):
                found.append(f"line {node.lineno}: open(..., {node.args[1].value!r})")
        elif name in WRITE_CALLS and not (name == "replace" and isinstance(node.func, ast.Attribute)
                                          and _is_str_method(node)):
            found.append(f"line {node.lineno}: {name}()")
    return found


def _is_str_method(node: ast.Call) -> bool:
    # str.replace(a, b) / bytes.replace(a, b) take two positional arguments; os.replace too, so only
    # calls on the os module count as file renames.
    func = node.func
    return not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os")


def test_only_the_cache_writer_can_write_files() -> None:
    offenders = {}
    for package in ("runs", "ui"):
        for path in (SRC / package).rglob("*.py"):
            rel = path.relative_to(SRC).as_posix()
            if rel in WRITERS:
                continue
            uses = [u for u in _write_uses(path) if "mkdir" not in u or package == "ui"]
            if uses:
                offenders[rel] = uses
    assert not offenders, f"modules other than the cache writer write files: {offenders}"
