"""The run catalog in the viewer: the ``catalog_run`` column, grouping by it, run attachments, and
local attachments served read-only only inside the roots (docs/catalog.md, "In the viewer").

Through a real Starlette app over real run folders written by the SDK logger, with real envelopes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from traceml_ai.runs.store import RunStore
from traceml_ai.sdk.logger import Run
from traceml_ai.ui.app import create_app
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.catalog_view import CATALOG_EVERY_S, CatalogView
from traceml_ai.ui.service import Viewer

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"
SECRET = "TOP SECRET: must never reach the page"
REMOTE_URL = "https://wandb.example.invalid/team/proj/runs/exp-1"


def _run_folder(root: Path, name: str, session_id: str | None, rank: int = 0) -> Path:
    """A completed run folder written by the SDK logger, with ``aggregator/manifest.json`` when
    ``session_id`` is given (a captured run: one catalog session)."""
    run = Run(root, name=name, params={"lr": 0.01})
    run.log(0, {"train/loss": 1.0})
    run.finish()
    folder = Path(run.dir)
    if session_id is not None:
        (folder / "aggregator").mkdir(exist_ok=True)
        manifest = {"format": "traceml.session_manifest", "session_id": session_id, "rank": rank,
                    "local_rank": rank, "world_size": 2, "role": "rank", "status": "completed",
                    "started_at_ns": 1764497700000000000, "ended_at_ns": 1764501300000000000}
        (folder / "aggregator" / "manifest.json").write_text(json.dumps(manifest))
        (folder / "aggregator" / "final_summary.json").write_text('{"verdict": "ok"}')
    return folder


def _envelope(folder: Path, run_id: str, sessions: list[str], attachments: Sequence[dict[str, Any]] = ()) -> None:
    doc = {"schema_version": 1, "format": "stormlog.run_envelope", "run_id": run_id, "metadata": {},
           "title": f"Experiment {run_id}", "sessions": [{"session_id": s, "metadata": {}} for s in sessions],
           # Stormlog's v1 schema: every attachment has a title and metadata
           "attachments": [{"title": a["attachment_id"], "metadata": {}, **a} for a in attachments]}
    (folder / "stormlog_run.json").write_text(json.dumps(doc))


def build_workspace(base: Path) -> Path:
    """``base/traceml/runs`` with:

    - ``rank0`` and ``rank1`` (sessions ``sess-0``/``sess-1``) grouped by ``stormlog_run.json`` in
      the root (run ``exp-1``), whose attachments are a file inside the root, a remote URL, a path
      leaving the root (``../../secret.txt``), ``/etc/passwd``, a symlink in the root pointing
      outside it, and the ``export/`` folder of ``rank0``;
    - ``dup-a`` and ``dup-b`` (sessions ``sess-a``/``sess-b``) each holding an envelope with the
      same run_id ``dup`` (both rejected: implicit runs, a warning on each run);
    - ``plain``, a run folder without a TraceML session.

    Returns the root.
    """
    root = base / "traceml" / "runs"
    root.mkdir(parents=True)
    (base / "secret.txt").write_text(SECRET)
    r0 = _run_folder(root, "rank0", "sess-0", rank=0)
    _run_folder(root, "rank1", "sess-1", rank=1)
    (r0 / "aggregator" / "export").mkdir()
    (r0 / "aggregator" / "export" / "STEP_TIME.jsonl").write_text('{"step": 1}\n')
    (root / "exp-notes.txt").write_text("Notes of experiment 1: <b>not bold</b>\n")
    os.symlink(base / "secret.txt", root / "link-out.txt")
    _envelope(root, "exp-1", ["sess-0", "sess-1"], [
        {"attachment_id": "notes", "title": "Experiment notes", "kind": "notes", "storage": "copy",
         "path": "exp-notes.txt", "session_id": "sess-0", "rank": 0},
        {"attachment_id": "wandb", "title": "W&B run", "kind": "experiment", "storage": "reference",
         "url": REMOTE_URL},
        {"attachment_id": "escape", "kind": "notes", "storage": "reference", "path": "../../secret.txt"},
        {"attachment_id": "passwd", "kind": "notes", "storage": "reference", "path": "/etc/passwd"},
        {"attachment_id": "link", "kind": "notes", "storage": "reference", "path": "link-out.txt"},
        {"attachment_id": "export", "kind": "export", "storage": "copy",
         "path": f"{r0.name}/aggregator/export"},
    ])
    _envelope(_run_folder(root, "dup-a", "sess-a"), "dup", ["sess-a"])
    _envelope(_run_folder(root, "dup-b", "sess-b"), "dup", ["sess-b"])
    _run_folder(root, "plain", None)
    return root


@pytest.fixture()
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRACEML_RUN_DIR", raising=False)
    return build_workspace(tmp_path)


def _client(root: Path) -> tuple[TestClient, Viewer]:
    store = RunStore([root])
    viewer = Viewer(store, CacheFolder(root.parent / ".cache", roots=[root]), refresh_interval_seconds=0.2)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    return client, viewer


def _rows(client: TestClient) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in client.get("/api/runs").json()["runs"]}


def _attachments(client: TestClient, key: str) -> dict[str, dict[str, Any]]:
    response = client.get(f"/api/runs/{key}/attachments")
    assert response.status_code == 200, response.text
    return {a["id"]: a for a in response.json()["attachments"]}


def test_each_run_folder_carries_its_catalog_run(workspace: Path) -> None:
    client, _ = _client(workspace)
    rows = _rows(client)
    assert rows["rank0"]["catalog_run"] == rows["rank1"]["catalog_run"] == "exp-1"
    # The rejected envelopes' sessions fall back to implicit runs, one per session.
    assert rows["dup-a"]["catalog_run"] == "session:sess-a"
    assert rows["dup-b"]["catalog_run"] == "session:sess-b"
    assert rows["plain"]["catalog_run"] is None


def test_grouping_by_catalog_run_puts_an_envelopes_sessions_together(workspace: Path) -> None:
    client, viewer = _client(workspace)
    table = client.get("/api/table", params={"group": "catalog_run"}).json()
    assert table["error"] is None
    names = {r.key: r.name for r in viewer.store.runs()}
    groups = [(g["label"], sorted(names[k] for k in g["keys"])) for g in table["groups"]]
    assert groups == [("exp-1", ["rank0", "rank1"]), ("session:sess-a", ["dup-a"]),
                      ("session:sess-b", ["dup-b"]), ("(none)", ["plain"])]
    # An envelope exists: the column is offered and shown by default.
    assert "catalog_run" in table["columns"]["available"]
    assert "catalog_run" in table["columns"]["default"]
    assert "catalog_run" in table["columns"]["shown"]


def test_catalog_run_column_sorts_and_filters(workspace: Path) -> None:
    client, viewer = _client(workspace)
    names = {r.key: r.name for r in viewer.store.runs()}
    table = client.get("/api/table", params={"sort": ["-catalog_run", "name"]}).json()
    assert table["error"] is None
    assert [names[k] for k in table["keys"]] == ["dup-b", "dup-a", "rank0", "rank1", "plain"]
    table = client.get("/api/table", params={"filter": "catalog_run:exp"}).json()
    assert table["error"] is None
    assert sorted(names[k] for k in table["keys"]) == ["rank0", "rank1"]
    table = client.get("/api/table", params={"filter": "catalog_run:/[/"}).json()
    assert table["error"] and "catalog_run" in table["error"]


def test_without_envelopes_the_column_is_offered_but_not_shown(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEML_RUN_DIR", raising=False)
    root = tmp_path / "traceml" / "runs"
    _run_folder(root, "captured", "sess-x")
    client, _ = _client(root)
    columns = client.get("/api/table").json()["columns"]
    assert "catalog_run" in columns["available"] and "catalog_run" not in columns["default"]


def test_rejected_duplicate_envelopes_are_file_problems_of_their_runs(workspace: Path) -> None:
    client, _ = _client(workspace)
    rows = _rows(client)
    for name in ("dup-a", "dup-b"):
        problems = [w for w in rows[name]["warnings"] if w.startswith("catalog:")]
        assert len(problems) == 1 and "stormlog_run.json: run_id" in problems[0] and "rejected" in problems[0]
    # The inspector's data carries them too.
    detail = client.get("/api/run", params={"key": rows["dup-a"]["key"]}).json()
    assert any("run_id 'dup'" in w for w in detail["run"]["warnings"])
    # A warning about a file in no run folder (the symlink in the root leaving it) is a global notice.
    notices = client.get("/api/runs").json()["warnings"]
    assert any(w.startswith("catalog: ") and "link-out.txt" in w for w in notices)


def test_attachments_of_an_envelope_run(workspace: Path) -> None:
    client, _ = _client(workspace)
    rows = _rows(client)
    payload = client.get(f"/api/runs/{rows['rank1']['key']}/attachments").json()
    assert payload["catalog_run"] == "exp-1" and payload["explicit"] and payload["title"] == "Experiment exp-1"
    items = {a["id"]: a for a in payload["attachments"]}
    notes = items["notes"]
    assert (notes["state"], notes["kind"], notes["storage"], notes["rank"], notes["session"]) == (
        "file", "notes", "copy", 0, "sess-0")
    assert notes["token"] and notes["url"] is None and notes["size_bytes"] > 0
    assert items["wandb"] == {**items["wandb"], "state": "remote", "url": REMOTE_URL, "token": None}
    for refused in ("escape", "passwd", "link"):
        assert items[refused]["state"] == "outside_root", refused
    assert items["export"]["state"] == "folder"
    # The sessions' own artifacts found by discovery are listed too.
    assert items["sess-0/aggregator/final_summary.json"]["state"] == "file"
    # No attachment names a path: the page gets tokens.
    assert str(workspace) not in json.dumps(payload)


def test_a_local_attachment_is_served_read_only_as_text(workspace: Path) -> None:
    client, _ = _client(workspace)
    items = _attachments(client, _rows(client)["rank0"]["key"])
    response = client.get(f"/api/attachments/{items['notes']['token']}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "Notes of experiment 1: <b>not bold</b>\n"
    listing = client.get(f"/api/attachments/{items['export']['token']}")
    assert listing.status_code == 200
    assert "STEP_TIME.jsonl  12 bytes" in listing.text and "listed, not opened" in listing.text


@pytest.mark.parametrize("attachment", ["escape", "passwd", "link"])
def test_an_attachment_outside_the_roots_is_refused(workspace: Path, attachment: str) -> None:
    client, _ = _client(workspace)
    items = _attachments(client, _rows(client)["rank0"]["key"])
    response = client.get(f"/api/attachments/{items[attachment]['token']}")
    assert response.status_code == 403
    assert "outside the viewer's roots" in response.json()["error"]
    assert SECRET not in response.text and "root:" not in response.text


def test_an_unknown_token_or_run_is_not_found(workspace: Path) -> None:
    client, _ = _client(workspace)
    assert client.get("/api/attachments/0123456789abcdef0123456789abcdef").status_code == 404
    assert client.get("/api/attachments/..%2F..%2Fsecret.txt").status_code == 404
    assert client.get("/api/runs/no-such-run/attachments").status_code == 404
    plain = client.get(f"/api/runs/{_rows(client)['plain']['key']}/attachments").json()
    assert plain == {"catalog_run": None, "explicit": False, "title": None, "attachments": []}


def test_a_file_replaced_by_a_link_leaving_the_root_is_refused(workspace: Path) -> None:
    client, _ = _client(workspace)
    items = _attachments(client, _rows(client)["rank0"]["key"])
    notes = workspace / "exp-notes.txt"
    notes.unlink()
    os.symlink(workspace.parent.parent / "secret.txt", notes)  # after the listing: checked when served
    response = client.get(f"/api/attachments/{items['notes']['token']}")
    assert response.status_code == 403 and SECRET not in response.text
    assert f"points to {workspace.parent.parent / 'secret.txt'}" in response.json()["error"]


def test_an_envelope_written_later_regroups_on_refresh(workspace: Path) -> None:
    client, _ = _client(workspace)
    rows = _rows(client)
    version = client.get("/api/runs").json()["version"]
    _envelope(workspace / rows["plain"]["id"], "exp-2", ["sess-a", "sess-b"])
    (workspace / rows["dup-a"]["id"] / "stormlog_run.json").unlink()
    (workspace / rows["dup-b"]["id"] / "stormlog_run.json").unlink()
    changed = client.post("/api/refresh", json={"since": version}).json()
    regrouped = {r["name"]: r for r in changed["runs"]}
    assert regrouped["dup-a"]["catalog_run"] == regrouped["dup-b"]["catalog_run"] == "exp-2"
    assert not [w for w in regrouped["dup-a"]["warnings"] if w.startswith("catalog:")]
    assert "rank0" not in regrouped  # unchanged rows are not sent again


def test_the_catalog_cache_is_written_beside_the_roots_not_inside(workspace: Path) -> None:
    _client(workspace)
    assert (workspace.parent / ".cache" / "catalog-facts.msgpack").is_file()
    assert not list(workspace.rglob("catalog-facts.msgpack"))


def test_a_table_export_with_the_catalog_column_still_writes(workspace: Path) -> None:
    client, viewer = _client(workspace)
    keys = [r.key for r in viewer.store.runs()]
    response = client.post("/api/export/table", json={"keys": keys, "columns": ["name", "catalog_run"]})
    assert response.status_code == 200 and response.json()["rows"] == len(keys)


def test_a_poll_opens_the_catalog_again_only_when_due(workspace: Path) -> None:
    now = [0.0]
    view = CatalogView([str(workspace)], None, clock=lambda: now[0])
    store = RunStore([workspace])
    store.poll()
    runs = store.runs()
    keys = {r.name: r.key for r in runs}
    view.refresh(runs)
    assert view.run_of(keys["dup-a"]) == "session:sess-a"
    for name in ("dup-a", "dup-b"):
        (Path(keys[name]) / "stormlog_run.json").unlink()
    _envelope(workspace, "exp-1", ["sess-0", "sess-1", "sess-a"])
    now[0] = CATALOG_EVERY_S - 1
    assert view.refresh(runs) == [] and view.run_of(keys["dup-a"]) == "session:sess-a"  # not due yet
    assert sorted(view.refresh(runs, force=True)) == sorted([keys["dup-a"], keys["dup-b"]])  # Refresh
    assert view.run_of(keys["dup-a"]) == "exp-1"
    _envelope(workspace, "exp-1", ["sess-0", "sess-1"])
    assert view.refresh(runs) == []
    now[0] += CATALOG_EVERY_S  # due again: the envelope's change is seen
    assert view.refresh(runs) == [keys["dup-a"]] and view.run_of(keys["dup-a"]) == "session:sess-a"
    _run_folder(workspace, "late", "sess-late")  # a new run folder makes it due at once
    store.poll()
    assert keys.keys() < {r.name for r in store.runs()}
    assert view.due([r.key for r in store.runs()], force=False)


def test_each_missing_envelope_field_is_its_own_file_problem(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    folder = _run_folder(root, "captured", "sess-x")
    (folder / "stormlog_run.json").write_text('{"schema_version": 1}')
    client, _ = _client(root)
    problems = [w for w in _rows(client)["captured"]["warnings"] if w.startswith("catalog:")]
    assert [p.split(": ")[2] for p in problems] == ["format", "run_id", "metadata"], problems


def test_a_folder_holding_only_an_envelope_is_not_a_broken_run_row(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run_folder(root, "rank0", "sess-0")
    (root / "experiment").mkdir()
    _envelope(root / "experiment", "exp-1", ["sess-0"])
    client, _ = _client(root)
    rows = _rows(client)
    assert set(rows) == {"rank0"}
    assert client.get(f"/api/runs/{rows['rank0']['key']}/attachments").json()["catalog_run"] == "exp-1"


def test_polls_go_on_updating_live_runs_while_the_catalog_is_opened(tmp_path: Path) -> None:
    """Review 16a: at 100,000 runs on a cold disk the first poll's catalog walk took minutes, and
    every later poll waited for it, so live runs did not update. A poll (or a Refresh) now goes on
    without the catalog while another opening is under way; a Refresh that came meanwhile opens it
    again afterwards. The walk is made slow here by holding it at its start (a slow disk)."""
    import threading

    root = tmp_path / "runs"
    _run_folder(root, "done", None)
    live = Run(root, name="live", params={"lr": 0.1})
    live.log(0, {"train/loss": 1.0})
    viewer = Viewer(RunStore([root]), CacheFolder(tmp_path / "cache", roots=[root]), refresh_interval_seconds=0.2)
    walking, go_on = threading.Event(), threading.Event()
    real_open = viewer.catalog._open

    def slow_open(real_roots: list[str]) -> Any:
        walking.set()
        go_on.wait(60)
        return real_open(real_roots)

    viewer.catalog._open = slow_open  # type: ignore[method-assign]
    first = threading.Thread(target=viewer.poll, name="first-poll", daemon=True)
    first.start()
    try:
        assert walking.wait(60), "the first poll never opened the catalog"
        assert next(r for r in viewer.store.runs() if r.name == "live").display_status == "running"
        live.log(1, {"train/loss": 0.5})
        live.finish()  # the live run ends during the walk: the next poll must show it
        later = threading.Thread(target=lambda: (viewer.poll(), viewer.poll(refresh=True)), daemon=True)
        later.start()
        later.join(60)
        assert not later.is_alive(), "a poll waited for the catalog opening under way"
        run = next(r for r in viewer.store.runs() if r.name == "live")
        assert run.display_status == "completed" and run.last["train/loss"] == 0.5
    finally:
        go_on.set()
        first.join(60)
    assert not first.is_alive()
    # The Refresh that came during the walk was not lost: the catalog is due again.
    assert viewer.catalog.due([r.key for r in viewer.store.runs()], force=False)
