"""Discovery over files and folders (004 seed, "Discovery Rules"; DESIGN §5): what is found, what is
not read, and that problems become warnings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import traceml_ai.catalog as catalog
from tests.catalog.fixtures import envelope, telemetry_jsonl, traceml_session, write_json
from traceml_ai.catalog.store import CacheFolderError


def codes(store: catalog.CatalogStore) -> list[str]:
    return [w.code for w in store.warnings]


def test_a_traceml_session_is_read_from_its_manifest_with_its_artifacts(tmp_path: Path) -> None:
    run = traceml_session(tmp_path / "runs" / "20261130-101500_base_a3f9", "sess-1", rank=None, world_size=4,
                          status="interrupted", started_at_ns=5, ended_at_ns=9)
    store = catalog.open([tmp_path / "runs"])
    (s,) = store.list_sessions()
    assert (s.session_id, s.kind, s.rank, s.world_size, s.role, s.status) == (
        "sess-1", "traceml_session", None, 4, "job", "interrupted")
    assert (s.started_at_ns, s.ended_at_ns, s.host) == (5, 9, "node-a")
    assert s.source_path == str(run / "aggregator" / "manifest.json")
    kinds = {a.kind: a for a in store.list_run_attachments()}
    assert set(kinds) == {"telemetry_database", "export", "final_summary"}
    assert all(a.storage == "copy" and a.session_id == "sess-1" for a in kinds.values())
    assert kinds["export"].path == str(run / "aggregator" / "export")
    # the run's metrics.jsonl and the exporter's JSONL records are not Stormlog telemetry sessions
    assert store.warnings == []


def test_a_missing_path_is_a_warning_and_the_others_are_still_read(tmp_path: Path) -> None:
    traceml_session(tmp_path / "runs" / "r", "s")
    store = catalog.open([tmp_path / "nope", tmp_path / "runs"])
    assert codes(store) == ["missing_path"]
    assert str(tmp_path / "nope") in str(store.warnings[0])
    assert len(store.list_runs()) == 1


def test_a_symlink_leaving_the_root_is_reported_and_not_read(tmp_path: Path) -> None:
    outside = traceml_session(tmp_path / "elsewhere" / "secret-run", "secret")
    root = tmp_path / "root"
    traceml_session(root / "mine", "mine")
    os.symlink(outside, root / "link-out")
    os.symlink(root / "mine", root / "link-in")  # inside the root: followed, read once
    store = catalog.open([root])
    assert [s.session_id for s in store.list_sessions()] == ["mine"]
    (w,) = store.warnings
    assert w.code == "outside_root" and w.path == str(root / "link-out") and str(outside) in w.message


def test_a_symlink_loop_is_walked_once(tmp_path: Path) -> None:
    traceml_session(tmp_path / "a" / "run", "s")
    os.symlink(tmp_path / "a", tmp_path / "a" / "loop")
    store = catalog.open([tmp_path / "a"])
    assert [s.session_id for s in store.list_sessions()] == ["s"]


def test_paths_with_spaces_and_non_ascii_letters(tmp_path: Path) -> None:
    folder = tmp_path / "Läufe mit Leerzeichen" / "训练 run"
    traceml_session(folder / "sitzung ä", "sitzung-ä")
    envelope(folder, "lauf-ü", ["sitzung-ä"], [{"attachment_id": "notiz", "title": "Notiz", "kind": "note",
                                                 "storage": "copy", "path": "notizen/ü b.txt", "metadata": {}}])
    (folder / "notizen").mkdir()
    (folder / "notizen" / "ü b.txt").write_text("ok", encoding="utf-8")
    store = catalog.open([str(tmp_path / "Läufe mit Leerzeichen")])
    (run,) = store.list_runs()
    assert run.run_id == "lauf-ü" and run.sessions == ("sitzung-ä",)
    note = store.list_run_attachments(kind="note")[0]
    assert note.path == str(folder / "notizen" / "ü b.txt")
    assert store.warnings == []


def test_a_bad_identity_field_is_named_and_read_as_unknown(tmp_path: Path) -> None:
    run = traceml_session(tmp_path / "r", "s")
    manifest = run / "aggregator" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["rank"] = "zero"
    write_json(manifest, doc)
    store = catalog.open([tmp_path])
    assert store.list_sessions()[0].rank is None
    (w,) = store.warnings
    assert (w.code, w.field, w.path) == ("invalid_session", "rank", str(manifest))


def test_other_manifests_are_not_catalog_files_and_a_jsonl_that_is_not_telemetry_is_named(tmp_path: Path) -> None:
    write_json(tmp_path / "web" / "manifest.json", {"name": "my app", "icons": []})
    (tmp_path / "data.jsonl").write_text('{"x": 1}\n', encoding="utf-8")
    store = catalog.open([tmp_path])
    assert store.list_runs() == []
    # Stormlog tries every *.jsonl as telemetry too (and records "load failed"): said, not silent
    (w,) = store.warnings
    assert (w.code, w.path) == ("telemetry_not_loaded", str(tmp_path / "data.jsonl")) and "timestamp" in w.message


def test_a_file_can_be_given_instead_of_a_folder(tmp_path: Path) -> None:
    telemetry_jsonl(tmp_path / "one.jsonl", "one")
    telemetry_jsonl(tmp_path / "two.jsonl", "two")
    store = catalog.open(tmp_path / "one.jsonl")
    assert [s.session_id for s in store.list_sessions()] == ["one"]


def test_the_parse_cache_lives_beside_the_root_and_is_used_on_the_next_open(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        traceml_session(root / f"r{i}", f"s{i}")
    envelope(root, "grouped", ["s0", "s1"])
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    cache = tmp_path / ".cache"
    first = catalog.open([root], cache_dir=cache)
    assert first.cache_misses == 4 and first.cache_hits == 0
    second = catalog.open([root], cache_dir=cache)
    assert second.cache_misses == 0 and second.cache_hits == 4
    assert [r.to_dict() for r in second.list_runs()] == [r.to_dict() for r in first.list_runs()]
    # a changed file is read again
    envelope(root, "grouped-renamed", ["s0", "s1", "s2"])
    third = catalog.open([root], cache_dir=cache)
    assert third.cache_misses == 1
    assert [r.run_id for r in third.list_runs()] == ["grouped-renamed"]
    # a session added to a folder walked before is found (the folder's cached listing is stale)
    traceml_session(root / "r3", "s3")
    fourth = catalog.open([root], cache_dir=cache)
    assert sorted(s.session_id for s in fourth.list_sessions()) == ["s0", "s1", "s2", "s3"]
    assert fourth.cache_misses == 1
    before += [Path("r3"), *(p.relative_to(root) for p in (root / "r3").rglob("*"))]
    # nothing was written inside the root
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == sorted(before)
    assert (cache / "catalog-facts.msgpack").is_file()


def test_an_open_with_nothing_changed_leaves_the_parse_cache_file_alone_and_a_damaged_entry_is_read_again(
    tmp_path: Path,
) -> None:
    # The cache keeps every entry as stored until it is looked up (issue 16: decoding them all at
    # open held half a gigabyte at 100,000 runs); an unchanged walk writes nothing back, and one
    # entry that is not a [signature, value] pair costs only that file's read.
    import msgspec

    root = tmp_path / "runs"
    for i in range(3):
        traceml_session(root / f"r{i}", f"s{i}")
    cache = tmp_path / ".cache"
    first = catalog.open([root], cache_dir=cache)
    blob = cache / "catalog-facts.msgpack"
    stamp = blob.stat().st_mtime_ns, blob.stat().st_ino
    second = catalog.open([root], cache_dir=cache)
    assert second.cache_misses == 0 and (blob.stat().st_mtime_ns, blob.stat().st_ino) == stamp
    data = msgspec.msgpack.decode(blob.read_bytes())
    damaged = sorted(data["entries"])[0]
    data["entries"][damaged] = "not a pair"
    blob.write_bytes(msgspec.msgpack.encode(data))
    third = catalog.open([root], cache_dir=cache)
    assert (third.cache_misses, third.cache_hits) == (1, second.cache_hits - 1)
    assert [s.to_dict() for s in third.list_sessions()] == [s.to_dict() for s in first.list_sessions()]
    assert catalog.open([root], cache_dir=cache).cache_misses == 0  # written back whole


def test_a_cache_folder_inside_a_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CacheFolderError, match="never writes inside a root"):
        catalog.open([tmp_path], cache_dir=tmp_path / ".cache")
    assert not (tmp_path / ".cache").exists()


def test_a_binary_catalog_file_is_reported_as_not_text(tmp_path: Path) -> None:
    (tmp_path / "stormlog_run.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    (w,) = catalog.open([tmp_path]).warnings
    assert w.message.startswith("is not UTF-8 text (a binary file?); not read")


def test_a_manifest_with_a_bad_rank_and_no_role_has_an_unknown_role(tmp_path: Path) -> None:
    traceml_session(tmp_path / "run", "s-0")
    manifest = tmp_path / "run" / "aggregator" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["rank"] = "zero"
    manifest.write_text(json.dumps(doc))
    store = catalog.open([tmp_path])
    (s,) = store.list_sessions()
    assert (s.rank, s.role) == (None, None)
    assert [(w.field, w.message) for w in store.warnings] == [("rank", 'has a bad value "zero"; read as unknown')]


def _walk(root: Path, cache: Path) -> tuple[int, list[tuple[str, str]], dict[str, Any]]:
    """One discovery with the parse cache in ``cache``: the folders listed from disk, the sessions
    found, and the folder entries the cache file then holds."""
    import msgspec

    from traceml_ai.catalog.cache import CACHE_FILE, FactCache
    from traceml_ai.catalog.discovery import discover

    facts = FactCache(cache)
    found = discover([root], facts)
    facts.save()
    sessions = sorted((src.kind, src.path) for src in found.sources)
    return facts.listed, sessions, msgspec.msgpack.decode((cache / CACHE_FILE).read_bytes())["dirs"]


def test_the_parse_cache_keeps_leaf_folders_inside_their_parent_and_lists_only_what_changed(tmp_path: Path) -> None:
    """A folder without folders in it (a run's artifacts/, logs/) is stored in its parent's entry by
    name, not under a path of its own (issue 16: 400,000 paths at 100,000 runs); a walk of an
    unchanged tree lists no folder from disk, and a change in a leaf, in a parent or of a leaf into
    a folder with folders lists just the folders that changed and finds what they hold."""
    root = tmp_path / "runs"
    for i in range(3):
        run = root / f"r{i}"
        (run / "artifacts").mkdir(parents=True)
        (run / "logs").mkdir()
        (run / "run.json").write_text("{}")
    (root / "r0" / "deep" / "deeper").mkdir(parents=True)
    cache = tmp_path / ".cache"
    real = os.path.realpath(root)

    listed, sessions, dirs = _walk(root, cache)
    assert listed == 3 * 3 + 1 + 2  # (root, each run and its two leaves, deep/ and deeper/)
    assert sorted(dirs) == sorted([real, *(f"{real}/r{i}" for i in range(3)), f"{real}/r0/deep"])
    assert sorted(dirs[f"{real}/r1"][2]) == ["artifacts", "logs"]
    assert sorted(dirs[f"{real}/r0/deep"][2]) == ["deeper"]
    assert _walk(root, cache)[0] == 0

    # a file in a leaf: that leaf alone is listed again, and its file is found
    telemetry_jsonl(root / "r1" / "logs" / "one.jsonl", "one")
    listed, sessions, dirs = _walk(root, cache)
    assert listed == 1 and len(sessions) == 1
    assert [n for n, _ in dirs[f"{real}/r1"][2]["logs"][1]] == ["one.jsonl"]
    assert _walk(root, cache)[:2] == (0, sessions)

    # a file in a run folder: the run folder alone (its leaves keep their own signatures)
    (root / "r2" / "notes.txt").write_text("x")
    assert _walk(root, cache)[0] == 1
    assert _walk(root, cache)[0] == 0

    # a leaf that gets a folder: it and the new folder are listed; it has an entry of its own now
    telemetry_jsonl(root / "r2" / "artifacts" / "inner" / "two.jsonl", "two")
    listed, sessions, dirs = _walk(root, cache)
    assert listed == 2 and len(sessions) == 2
    assert f"{real}/r2/artifacts" in dirs and sorted(dirs[f"{real}/r2/artifacts"][2]) == ["inner"]
    assert sorted(dirs[f"{real}/r2"][2]) == ["logs"]
    assert _walk(root, cache)[:2] == (0, sessions)

    # the same sessions as a walk without the cache, and a removed leaf is forgotten
    assert [s.to_dict() for s in catalog.open([root], cache_dir=cache).list_sessions()] == [
        s.to_dict() for s in catalog.open([root]).list_sessions()]
    (root / "r1" / "logs" / "one.jsonl").unlink()
    (root / "r1" / "logs").rmdir()
    listed, sessions, dirs = _walk(root, cache)
    assert listed == 1 and len(sessions) == 1 and sorted(dirs[f"{real}/r1"][2]) == ["artifacts"]


def test_a_damaged_leaf_in_the_parse_cache_is_listed_again(tmp_path: Path) -> None:
    import msgspec

    from traceml_ai.catalog.cache import CACHE_FILE

    root = tmp_path / "runs"
    (root / "r0" / "logs").mkdir(parents=True)
    telemetry_jsonl(root / "r0" / "logs" / "one.jsonl", "one")
    cache = tmp_path / ".cache"
    first = _walk(root, cache)
    blob = cache / CACHE_FILE
    data = msgspec.msgpack.decode(blob.read_bytes())
    real = os.path.realpath(root)
    data["dirs"][f"{real}/r0"][2]["logs"] = ["not", "a", "listing"]
    blob.write_bytes(msgspec.msgpack.encode(data))
    listed, sessions, _ = _walk(root, cache)
    # the entry holding it (the run folder and its leaves) is listed again; nothing is lost
    assert listed == 2 and sessions == first[1] and len(sessions) == 1
    assert _walk(root, cache)[:2] == (0, first[1])
