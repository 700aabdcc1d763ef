"""The request bodies of the viewer's API: one pydantic model each (ui/requests.py), and the page's
types generated from them (web/src/requests.ts), so server and page cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ui.test_api import _auth, _client, workspace  # noqa: F401  (fixture)
from traceml_ai.ui.requests import TYPES_FILE, typescript

ROOT = Path(__file__).resolve().parents[2]


def test_the_pages_request_types_are_generated_from_the_current_models() -> None:
    """Fails when a model changed and ``python -m traceml_ai.ui.requests`` was not run: the page
    would send bodies the server no longer takes (strict tsc then checks the page against it)."""
    written = (ROOT / TYPES_FILE).read_text(encoding="utf-8")
    assert written == typescript(), "stale: run `python -m traceml_ai.ui.requests > web/src/requests.ts`"


def test_the_page_builds_its_bodies_from_the_generated_types() -> None:
    api = (ROOT / "web" / "src" / "api.ts").read_text(encoding="utf-8")
    for name in ("SeriesRequest", "RefreshRequest", "HideRequest", "ExportTableRequest"):
        assert f"satisfies {name})" in api, name


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/hide", {"keys": ["a"], "hidden": 1}, "hidden"),
    ("/api/hide", {"keys": ["a", 3]}, "keys.1"),
    ("/api/series", {"keys": [], "metrics": [], "ema": "0.5"}, "ema"),
    ("/api/series", {"keys": [], "metrics": [], "x": "wall"}, "x"),
    ("/api/export/table", {"keys": "abc"}, "keys"),
])
def test_a_body_field_of_the_wrong_type_is_a_400_naming_it(workspace: Path, path: str,  # noqa: F811
                                                           body: dict[str, Any], field: str) -> None:
    client, _ = _client(workspace)
    response = _auth(client).post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{field}: "), response.json()


def test_unknown_fields_are_ignored_and_defaults_apply(workspace: Path) -> None:  # noqa: F811
    client, viewer = _client(workspace)
    key = next(r.key for r in viewer.store.runs())
    response = _auth(client).post("/api/hide", json={"keys": [key], "extra": {"nested": True}})
    assert response.status_code == 200 and key in response.json()["hidden"]  # hidden defaults to true
    refreshed = client.post("/api/refresh", json={"since": "yesterday"})  # not a counter: the whole table
    assert refreshed.status_code == 200 and len(refreshed.json()["runs"]) > 0
