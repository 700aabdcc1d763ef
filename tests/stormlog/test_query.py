"""``stormlog.query``: the 004 seed's Python example works as written, on the same store as
``traceml_ai.catalog`` (DESIGN §1: stormlog is a face of the catalog, no logic of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceml_ai.catalog
from tests.catalog.fixtures import SEED_MINIMAL_ENVELOPE


def test_the_seed_python_example_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "stormlog_run.json").write_text(SEED_MINIMAL_ENVELOPE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    import stormlog.query

    store = stormlog.query.open(["./artifacts"])
    runs = store.list_runs()
    attachments = store.list_run_attachments()

    assert [r.run_id for r in runs] == ["run-train-42"]
    assert [a.attachment_id for a in attachments] == ["rank0-profiler"]
    # the session is named but not on disk here: listed, and said so
    assert [w.code for w in store.warnings] == ["session_not_found"]
    assert isinstance(store, traceml_ai.catalog.CatalogStore)
    assert stormlog.query.open is traceml_ai.catalog.open


def test_stormlog_imports_nothing_of_ours_but_the_catalog() -> None:
    import ast

    folder = Path(stormlog_folder())
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.startswith("traceml_ai"):
                    assert name == "traceml_ai.catalog", f"{path.name} imports {name}"


def stormlog_folder() -> str:
    import stormlog

    return str(Path(stormlog.__file__).parent)
