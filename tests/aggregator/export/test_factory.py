"""The ``exporter`` setting: ``jsonl``, ``otlp`` and ``module:factory`` (000 seed, "Custom exporters")."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.export.sample import RECORDS_PER_FULL_ENVELOPE, full_envelope
from traceml_ai.aggregator.export import (
    ExporterContext,
    ExporterLoadError,
    JsonlExporter,
    check_exporter_form,
    load_exporter,
    make_export_worker,
    parse_export_streams,
)

# The 000 seed's one-file example exporter, verbatim.
ONE_FILE_EXPORTER = '''\
import json
class OneFileExporter:
    def __init__(self, path, include_hostname):
        self._path = path
        self._include_hostname = include_hostname
        self._file = None
    def open(self):
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._path, "x", encoding="utf-8")
    def write(self, records):
        for record in records:
            data = record.to_dict()
            if not self._include_hostname:
                data.pop("hostname", None)
            self._file.write(json.dumps(data) + "\\n")
    def flush(self):
        self._file.flush()
    def close(self, *, dropped_batches=0):
        self._file.close()
def make_exporter(context):
    return OneFileExporter(
        context.export_dir / "records.jsonl",
        context.include_hostname,
    )
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write modules into a folder on sys.path (as PYTHONPATH would put it); forget them afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written: list[str] = []

    def write(name: str, source: str) -> None:
        (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def context(tmp_path: Path, streams: str = "step_time", include_hostname: bool = False) -> ExporterContext:
    return ExporterContext.for_run(tmp_path / "run", include_hostname=include_hostname,
                                   streams=parse_export_streams(streams))


@pytest.mark.parametrize("value", ["jsonl", "otlp", "my_exporters:make_exporter", "company.telemetry.sinks:factory",
                                   "_private:_make"])
def test_the_form_accepted_is_jsonl_otlp_or_a_dotted_module_path_a_colon_and_one_identifier(value: str) -> None:
    assert check_exporter_form(value) == value


@pytest.mark.parametrize("value", ["", "json", "my_exporters", "my_exporters:", ":make", "my-exporters:make",
                                   "a..b:make", "a.b:make.sub", "a:b:c", "mod:make()", "class:make", "mod: make",
                                   "path/to/mod:make"])
def test_any_other_form_is_a_one_line_value_error(value: str) -> None:
    with pytest.raises(ValueError, match="is not jsonl, otlp or module:factory"):
        check_exporter_form(value)


def test_checking_the_form_never_imports_the_module(modules: Any) -> None:
    modules("never_imported_exporter", "raise SystemExit('imported!')\n")
    assert check_exporter_form("never_imported_exporter:make") == "never_imported_exporter:make"
    assert "never_imported_exporter" not in sys.modules


def test_the_context_has_session_root_export_dir_include_hostname_and_streams_in_record_table_order(
    tmp_path: Path, modules: Any,
) -> None:
    modules("ctx_exporter", """
        import threading
        SEEN = []
        def make(context):
            SEEN.append((context, threading.current_thread().name, [t.name for t in threading.enumerate()]))
            return object()
    """)
    worker = make_export_worker("ctx_exporter:make", tmp_path / "run", export_streams="system,step_time",
                                include_hostname=True)
    import ctx_exporter  # type: ignore[import-not-found]

    ((ctx, thread, threads),) = ctx_exporter.SEEN
    assert ctx == ExporterContext(tmp_path / "run", tmp_path / "run" / "aggregator" / "export", True,
                                  ("step_time", "system", "system_gpu"))
    assert not ctx.export_dir.exists()  # TraceML does not create it for a factory
    # the factory ran on the calling (main) thread, before the worker thread existed
    assert thread == threading.current_thread().name and "traceml-export" not in threads
    assert worker.streams == ctx.streams and worker.exporter is not None


def test_jsonl_is_the_built_in_json_lines_exporter(tmp_path: Path) -> None:
    exporter = load_exporter("jsonl", context(tmp_path, "system", include_hostname=True))
    assert isinstance(exporter, JsonlExporter)
    assert exporter.export_dir == tmp_path / "run" / "aggregator" / "export"
    assert exporter.streams == ("system", "system_gpu") and exporter.include_hostname


def test_the_seeds_one_file_example_exporter_works_unchanged(tmp_path: Path, modules: Any) -> None:
    modules("my_exporters", ONE_FILE_EXPORTER)
    worker = make_export_worker("my_exporters:make_exporter", tmp_path / "run", export_streams="step_time,process")
    worker.start()
    worker.submit([full_envelope(0), full_envelope(1)])
    worker.close()
    assert not worker.failed, worker.failure
    found = [json.loads(line) for line in (tmp_path / "run" / "aggregator" / "export" / "records.jsonl").open()]
    per = RECORDS_PER_FULL_ENVELOPE
    assert [line["stream"] for line in found] == ["step_time"] * per["step_time"] + ["process"] * per["process"] \
        + ["step_time"] * per["step_time"] + ["process"] * per["process"]
    assert all("hostname" not in line for line in found)


FAILURES = {
    # The module was found; only a package it imports is missing: that package is named, not the module.
    "import error": ("broken_imports", "import not_a_real_package_xyz\n", "broken_imports:make",
                     "module broken_imports was found but failed to import: it imports 'not_a_real_package_xyz', "
                     "which is not installed (ModuleNotFoundError: No module named 'not_a_real_package_xyz')"),
    "missing module": (None, None, "no_such_exporter_module:make",
                       "cannot import no_such_exporter_module: ModuleNotFoundError: No module named "
                       "'no_such_exporter_module' (install it, or put its folder on PYTHONPATH)"),
    "missing package of a dotted path": (None, None, "no_such_pkg_xyz.sinks:make",
                                         "cannot import no_such_pkg_xyz.sinks: ModuleNotFoundError: No module "
                                         "named 'no_such_pkg_xyz' (install it, or put its folder on PYTHONPATH)"),
    "missing attribute": ("no_factory", "def other(context):\n    return object()\n", "no_factory:make",
                          "module no_factory has no attribute 'make'"),
    "exception in the module": ("raises_on_import", "raise RuntimeError('no credentials')\n",
                                "raises_on_import:make",
                                "module raises_on_import was found but raised while being imported: "
                                "RuntimeError: no credentials"),
    "KeyboardInterrupt in the module": ("interrupts_on_import", "raise KeyboardInterrupt\n",
                                        "interrupts_on_import:make", "raised while being imported: KeyboardInterrupt"),
    "SystemExit in the module": ("exits_on_import", "import sys\nsys.exit(4)\n", "exits_on_import:make",
                                 "SystemExit: 4"),
    "exception in the factory": ("factory_raises", "def make(context):\n    raise ValueError('bad endpoint')\n",
                                 "factory_raises:make", "factory_raises:make(context) raised ValueError: bad endpoint"),
    "SystemExit in the factory": ("factory_exits", "def make(context):\n    raise SystemExit('bye')\n",
                                  "factory_exits:make", "factory_exits:make(context) raised SystemExit: bye"),
    "KeyboardInterrupt in the factory": ("factory_interrupts", "def make(context):\n    raise KeyboardInterrupt\n",
                                         "factory_interrupts:make",
                                         "factory_interrupts:make(context) raised KeyboardInterrupt"),
    "factory returns None": ("factory_none", "def make(context):\n    return None\n", "factory_none:make",
                             "factory_none:make(context) returned None instead of an exporter"),
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_every_kind_of_factory_failure_is_treated_like_an_exporter_whose_open_raised(
    kind: str, tmp_path: Path, modules: Any,
) -> None:
    module, source, value, message = FAILURES[kind]
    if module is not None:
        modules(module, source)
    with pytest.raises(ExporterLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_exporter(value, context(tmp_path))
    logged: list[str] = []
    worker = make_export_worker(value, tmp_path / "run", export_streams="step_time", log=logged.append)
    worker.start()
    worker.submit(full_envelope(0))
    worker.close()
    assert worker.exporter is None and worker.failed
    assert len(logged) == 1 and logged[0].startswith(f"[TraceML] exporter {value!r} failed in factory: ")
    assert message in logged[0]
    report = worker.report()
    assert report["exporter_failed"] is True
    assert report["failed_records"] == report["admitted_records"] == RECORDS_PER_FULL_ENVELOPE["step_time"]


def test_make_export_worker_rejects_a_bad_form_or_unknown_streams_before_importing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not jsonl, otlp or module:factory"):
        make_export_worker("jsonl.py", tmp_path, export_streams="step_time")
    with pytest.raises(ValueError, match="supported names: step_time, step_memory, process, system, all"):
        make_export_worker("jsonl", tmp_path, export_streams="gpu")
