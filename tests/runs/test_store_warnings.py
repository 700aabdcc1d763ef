"""Things a run folder can get wrong that readers report as warnings on that run (never errors)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from traceml_ai.runs.store import RunStore


def _run(root: Path, name: str, run_json: dict | None = None, jsonl: str | None = None) -> Path:
    folder = root / f"20261130-101500_{name}_abcd"
    folder.mkdir(parents=True)
    if run_json is not None:
        (folder / "run.json").write_text(json.dumps(run_json))
    if jsonl is not None:
        (folder / "metrics.jsonl").write_text(jsonl)
    return folder


def _runs(root: Path) -> dict:
    store = RunStore([root])
    store.poll()
    return {r.name: r for r in store.runs()}


def test_suspicious_run_json_fields_are_warned_about(tmp_path: Path) -> None:
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
    _run(tmp_path, "odd", {"name": "odd", "status": "exploded", "started_at": "yesterday",
                           "schema_version": "abc", "heartbeat_at": future})
    _run(tmp_path, "skewed", {"name": "skewed", "status": "running", "heartbeat_at": future})
    runs = _runs(tmp_path)
    text = " | ".join(runs["odd"].warnings)
    assert "status 'exploded'" in text and "started_at 'yesterday'" in text and "schema_version" in text
    assert runs["odd"].display_status == "unknown" and runs["odd"].started_at is None
    assert runs["skewed"].display_status == "running"
    assert any("in the future" in w for w in runs["skewed"].warnings)


def test_an_empty_folder_is_a_run_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    runs = _runs(tmp_path)
    assert runs["empty"].display_status == "legacy"
    assert any("no run files" in w for w in runs["empty"].warnings)


def test_infinity_in_a_legacy_history_is_a_gap_not_a_value(tmp_path: Path) -> None:
    _run(tmp_path, "legacy", None, '{"step": 0, "val/loss": 1.0}\n{"step": 1, "val/loss": Infinity}\n')
    run = _runs(tmp_path)["legacy"]
    assert run.start == {"val/loss": 1.0}
    assert run.last == {"val/loss": None}
