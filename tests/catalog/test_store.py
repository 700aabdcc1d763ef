"""Query filters of the store (004 seed, "Query API"): keyword arguments, one value or several."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceml_ai.catalog as catalog
from tests.catalog.fixtures import envelope, sidecar, telemetry_jsonl


def _root(tmp_path: Path) -> Path:
    for rank in range(3):
        telemetry_jsonl(tmp_path / "job-a" / f"r{rank}.jsonl", f"a{rank}", job_id="a", rank=rank, world_size=3)
    telemetry_jsonl(tmp_path / "job-b" / "r0.jsonl", "b0", job_id="b", rank=0, world_size=1)
    envelope(tmp_path / "job-a", "run-a", ["a0", "a1", "a2"], [
        {"attachment_id": "nsys-0", "title": "nsys rank 0", "kind": "profiler_trace", "storage": "reference",
         "path": "t0.nsys-rep", "rank": 0, "source_namespace": "nsys", "source_ref": "rank0", "metadata": {}},
        {"attachment_id": "wandb", "title": "W&B", "kind": "experiment", "storage": "reference",
         "url": "https://wandb.example/e/p/r", "source_namespace": "wandb", "source_ref": "e/p/r", "metadata": {}},
    ], job_id="a", source_namespace="wandb", source_ref="e/p/r", tags=["baseline"])
    sidecar(tmp_path / "job-b", [{"attachment_id": "note", "title": "Note", "kind": "note", "path": "n.md",
                                  "session_id": "b0", "metadata": {}}])
    return tmp_path


@pytest.fixture
def store(tmp_path: Path) -> catalog.CatalogStore:
    return catalog.open([_root(tmp_path)])


def ids(rows: list[catalog.RunRow]) -> list[str]:
    return [r.run_id for r in rows]


def test_run_filters(store: catalog.CatalogStore) -> None:
    assert ids(store.list_runs()) == ["run-a", "job:b"]
    assert ids(store.list_runs(run_id="job:b")) == ["job:b"]
    assert ids(store.list_runs(run_id=["run-a", "job:b", "nothing"])) == ["run-a", "job:b"]
    assert ids(store.list_runs(job_id="a")) == ["run-a"]
    assert ids(store.list_runs(session_id="a2")) == ["run-a"]
    assert ids(store.list_runs(rank=2)) == ["run-a"]
    assert ids(store.list_runs(rank=[0])) == ["run-a", "job:b"]
    assert ids(store.list_runs(kind="note")) == ["job:b"]
    assert ids(store.list_runs(source_namespace="wandb", source_ref="e/p/r")) == ["run-a"]
    assert ids(store.list_runs(job_id="a", rank=0, kind="note")) == []  # all filters must match
    (run,) = store.list_runs(run_id="run-a")
    assert (run.tags, run.session_count, run.ranks) == (("baseline",), 3, (0, 1, 2))


def test_attachment_filters(store: catalog.CatalogStore) -> None:
    assert [a.attachment_id for a in store.list_run_attachments(source_namespace="nsys")] == ["nsys-0"]
    assert [a.attachment_id for a in store.list_run_attachments(kind="experiment")] == ["wandb"]
    assert [(a.kind, a.title) for a in store.list_run_attachments(run_id="job:b")] == [
        ("note", "Note"), ("telemetry_file", "r0.jsonl")]
    assert "wandb" in [a.attachment_id for a in store.list_run_attachments(job_id="a")]
    assert [a.kind for a in store.list_run_attachments(rank=0, run_id="run-a")] == ["profiler_trace", "telemetry_file"]


def test_session_filters(store: catalog.CatalogStore) -> None:
    assert [s.session_id for s in store.list_sessions(run_id="run-a")] == ["a2", "a1", "a0"]
    assert [s.session_id for s in store.list_sessions(rank=1)] == ["a1"]
    assert [s.session_id for s in store.list_sessions(kind="telemetry_jsonl", job_id="b")] == ["b0"]
    assert [s.session_id for s in store.list_sessions(source_namespace="wandb")] == ["a2", "a1", "a0"]
    assert [s.session_id for s in store.list_sessions(status="completed", world_size=1)] == ["b0"]
    assert store.list_sessions(has_oom_bundle=True) == []


def test_stormlog_filter_objects_give_what_stormlogs_store_gives(tmp_path: Path) -> None:
    """``traceml_ai.catalog.open()`` takes Stormlog's filter objects as ``stormlog.query.open()`` does,
    and answers with the same rows (``as_dict()``), field by field."""
    from tests.catalog.stormlog_real import require_stormlog, same_rows

    require_stormlog()
    import stormlog.query

    root = _root(tmp_path)
    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    for method, filters in (("list_runs", [stormlog.query.RunFilter(), stormlog.query.RunFilter(rank=1),
                                           stormlog.query.RunFilter(source_namespace="wandb")]),
                            ("list_run_attachments", [stormlog.query.RunAttachmentFilter(run_id="job:b"),
                                                      stormlog.query.RunAttachmentFilter(kind="experiment")]),
                            ("list_sessions", [stormlog.query.SessionFilter(job_id="a"),
                                               stormlog.query.SessionFilter(status="completed", rank=0)])):
        for f in filters:
            mine = getattr(ours, method)(getattr(catalog, type(f).__name__)(**vars(f)))
            same_rows([r.as_dict() for r in mine], [r.as_dict() for r in getattr(theirs, method)(f)])
    assert [w.message for w in theirs.catalog.warnings] == [w.message for w in ours.catalog.warnings] == []


def test_an_unknown_filter_is_a_type_error(store: catalog.CatalogStore) -> None:
    with pytest.raises(TypeError):
        store.list_runs(colour="red")  # type: ignore[call-arg]


def test_rows_have_a_json_shape(store: catalog.CatalogStore) -> None:
    d = store.list_runs(run_id="run-a")[0].to_dict()
    assert d["sessions"] == ["a0", "a1", "a2"] and d["explicit"] is True and d["tags"] == ["baseline"]
    assert set(store.list_run_attachments()[0].to_dict()) >= {
        "run_id", "attachment_id", "title", "kind", "storage", "path", "url", "session_id", "job_id", "rank",
        "local_rank", "world_size", "start_ns", "end_ns", "metadata", "source_path", "source_kind", "declared_in"}


@pytest.mark.parametrize(("text", "fields"), [
    ("{}", ["schema_version", "format", "run_id", "metadata"]),
    ('{"format": "stormlog.run_envelope", "run_id": "r1"}', ["schema_version", "metadata"]),
])
def test_each_missing_envelope_field_is_one_warning(tmp_path: Path, text: str, fields: list[str]) -> None:
    (tmp_path / "stormlog_run.json").write_text(text, encoding="utf-8")
    warnings = catalog.open([tmp_path]).warnings
    assert [(w.field, w.code) for w in warnings] == [(f, "invalid_envelope") for f in fields]
    assert all(w.message.startswith("is required (v1 schema); envelope rejected") for w in warnings)


def test_the_store_keeps_every_warning_however_many(tmp_path: Path) -> None:
    envelope(tmp_path, "big", [f"absent-{i}" for i in range(25)])
    warnings = catalog.open([tmp_path]).warnings
    assert [w.code for w in warnings] == ["session_not_found"] * 25


@pytest.mark.parametrize("filters", [{"rank": "0"}, {"rank": [0, "1"]}, {"rank": True}, {"run_id": 42},
                                     {"job_id": ["a", None]}])
def test_a_filter_of_the_wrong_type_raises_instead_of_matching_nothing(store: catalog.CatalogStore,
                                                                       filters: dict[str, object]) -> None:
    name = next(iter(filters))
    for method in (store.list_runs, store.list_run_attachments, store.list_sessions):
        with pytest.raises(TypeError, match=f"{name} must be an? (int|string) or a list of them"):
            method(**filters)
    assert ids(store.list_runs(rank=0)) == ids(store.list_runs(rank=[0])) == ["run-a", "job:b"]
