"""Fresh-user review of the catalog against real Stormlog 0.4.3 (issue 10): what a user sees on
stderr for a bad ledger entry, a sidecar item, Stormlog's own minimal sidecar, an empty JSON
file, and what ``open()`` does with a str. The rows are compared with real ``stormlog query``;
where TraceML deliberately differs, the test says so and docs/catalog.md lists it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import traceml_ai.catalog as catalog
from tests.catalog.stormlog_real import (
    T0,
    require_stormlog,
    same_rows,
    sink_session,
    stormlog_query,
    stormlog_warnings,
    traceml_query,
    write_json,
)

require_stormlog()


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_a_bad_ledger_entry_names_its_field_and_says_nan(tmp_path: Path) -> None:
    """A sink ledger entry whose ``started_at_ns`` is NaN: Stormlog skips the entry (and reads the
    session from its events), as TraceML does; TraceML's warning names ``sessions[0].started_at_ns``
    and shows the value as NaN, the way the file holds it, not as null."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-nan", T0)
    manifest = root / "sink" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["sessions"][0]["started_at_ns"] = float("nan")
    manifest.write_text(json.dumps(doc), encoding="utf-8")
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    _, stderr = traceml_query("sessions", root)
    (line,) = [w for w in _warnings(stderr) if "manifest.json" in w]
    assert "sessions[0].started_at_ns: is NaN, not a whole number" in line and "null" not in line
    assert "ledger entry is skipped" in line


def test_a_ledger_entry_with_a_bad_status_names_status(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-st", T0)
    manifest = root / "sink" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["sessions"][0]["status"] = "zombie"
    manifest.write_text(json.dumps(doc), encoding="utf-8")
    same_rows(traceml_query("sessions", root)[0], stormlog_query("sessions", root))
    _, stderr = traceml_query("sessions", root)
    assert 'sessions[0].status: is "zombie", not one of' in stderr


def test_stormlogs_minimal_sidecar_gives_no_warning_and_a_bad_item_says_v1_schema_once(tmp_path: Path) -> None:
    """Sidecar items without ``metadata`` (Stormlog's own minimal shape): real Stormlog reads them
    (metadata ``{}``) without a warning, and so does TraceML; an item with an unknown field gets one
    line naming the field, saying "v1 schema" once."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    items = [{"title": f"link {i}", "kind": "link", "url": f"https://example.org/{i}", "session_id": "s1"}
             for i in range(7)]
    write_json(root / "side" / "stormlog_attachments.json",
               {"schema_version": 1, "format": "stormlog.attachments", "attachments": items})
    assert stormlog_warnings(root) == []
    rows, stderr = traceml_query("attachments", root)
    same_rows(rows, stormlog_query("attachments", root))
    assert _warnings(stderr) == []
    write_json(root / "side" / "stormlog_attachments.json",
               {"schema_version": 1, "format": "stormlog.attachments",
                "attachments": [*items, {**items[0], "title": "colored", "color": "red"}]})
    rows, stderr = traceml_query("attachments", root)
    same_rows(rows, stormlog_query("attachments", root))
    (line,) = _warnings(stderr)
    assert "attachments[7].color" in line and line.count("v1 schema") == 1 and "kept" in line


def test_deliberate_difference_an_empty_json_file_is_named(tmp_path: Path) -> None:
    """Telemetry-named JSON files holding ``{}`` or ``[]``: Stormlog records a load failure for
    ``{}`` and skips ``[]`` without a word; TraceML lists the same (no) rows and names each file
    (docs/catalog.md, "Differences")."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    write_json(root / "t" / "telemetry_obj.json", {})
    write_json(root / "t" / "telemetry_list.json", [])
    theirs = {Path(p).name for p, _ in stormlog_warnings(root)}
    assert theirs == {"telemetry_obj.json"}
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    _, stderr = traceml_query("sessions", root)
    named = [w for w in _warnings(stderr) if "/t/" in w]
    assert len(named) == 2
    assert any("telemetry_list.json" in w and "empty list" in w for w in named)
    assert any("telemetry_obj.json" in w for w in named)
    store = catalog.open([root])
    assert {Path(w.path).name for w in store.warnings} >= {"telemetry_obj.json", "telemetry_list.json"}


def test_deliberate_difference_open_takes_a_str_or_path_as_one_path(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``open("ab")`` and ``open(Path("ab"))`` search the one folder ``ab`` in TraceML, as
    ``open(["ab"])`` does. Stormlog iterates a str character by character (``open("ab")`` searches
    the folders ``a`` and ``b``, and ``"/..."`` the whole disk) and refuses a Path with TypeError."""
    import stormlog.query

    root = tmp_path.resolve()
    sink_session(root / "ab", "in-ab", T0)
    sink_session(root / "a", "in-a", T0 + 1)
    sink_session(root / "b", "in-b", T0 + 2)
    monkeypatch.chdir(root)
    as_list = [s.session_id for s in catalog.open(["ab"]).list_sessions()]
    assert as_list == ["in-ab"]
    assert [s.session_id for s in catalog.open("ab").list_sessions()] == as_list
    assert [s.session_id for s in catalog.open(Path("ab")).list_sessions()] == as_list
    assert [s.session_id for s in stormlog.query.open(["ab"]).list_sessions()] == as_list
    assert sorted(s.session_id for s in stormlog.query.open("ab").list_sessions()) == ["in-a", "in-b"]
    with pytest.raises(TypeError):
        stormlog.query.open(Path("ab"))  # type: ignore[arg-type]
    assert os.getcwd() == str(root)
