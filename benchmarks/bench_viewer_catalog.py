"""What the run catalog adds to the viewer's poll (docs/catalog.md, "In the viewer").

Writes ``--runs`` fake runs (``traceml fake-runs``), makes every tenth a captured session
(``aggregator/manifest.json``) and groups those by envelopes of ten, then measures in this process,
with the parse cache in the cache folder beside the root:

- the run store's no-change poll (what a poll cost before);
- opening the catalog over the same root (warm parse cache), as a poll does when it is due;
- ``Viewer.poll()`` when the catalog is not due (the usual poll: at most every 30 s it is).

    .venv/bin/python benchmarks/bench_viewer_catalog.py [--runs 2000] [--repeat 5] [--root DIR]

``--root`` measures an existing runs folder instead (e.g. the ``traceml demo`` workspace's
``traceml/runs``); its cache goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer


def _workspace(base: Path, runs: int) -> Path:
    root = base / "traceml" / "runs"
    generate(root, runs=runs, seed=0)
    folders = sorted(p for p in root.iterdir() if p.is_dir())[::10]
    for i, folder in enumerate(folders):
        (folder / "aggregator").mkdir(exist_ok=True)
        (folder / "aggregator" / "manifest.json").write_text(json.dumps(
            {"format": "traceml.session_manifest", "session_id": f"s-{i}", "rank": i % 10, "world_size": 10}))
    for e in range(0, len(folders), 10):
        doc = {"schema_version": 1, "format": "stormlog.run_envelope", "run_id": f"exp-{e // 10}", "metadata": {},
               "sessions": [{"session_id": f"s-{i}"} for i in range(e, min(e + 10, len(folders)))]}
        (folders[e] / "stormlog_run.json").write_text(json.dumps(doc))
    return root


def _median_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root.resolve() if args.root else _workspace(Path(tmp), args.runs)
        cache_dir = Path(tmp) / ".cache" if args.root else root.parent / ".cache"
        store = RunStore([root])
        viewer = Viewer(store, CacheFolder(cache_dir, roots=[root]))
        viewer.poll()  # first poll: runs read, catalog opened cold (parse cache written)
        runs = store.runs()
        store_ms = _median_ms(store.poll, args.repeat)
        catalog_ms = _median_ms(lambda: viewer.catalog.refresh(runs, force=True), args.repeat)
        poll_ms = _median_ms(viewer.poll, args.repeat)
        grouped = sum(1 for r in runs if viewer.catalog.run_of(r.key))
        print(f"{len(runs)} run folders under {root} ({grouped} with a catalog run)")
        print(f"run store poll, no change:            {store_ms:8.1f} ms (median of {args.repeat})")
        print(f"catalog opened (warm parse cache):    {catalog_ms:8.1f} ms  <- added to a poll when due")
        print(f"viewer poll, catalog not due:         {poll_ms:8.1f} ms")


if __name__ == "__main__":
    main()
