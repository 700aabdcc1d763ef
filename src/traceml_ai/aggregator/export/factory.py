"""The ``exporter`` setting: ``jsonl``, ``otlp`` or ``module:factory`` (000 seed, "Custom exporters").

:func:`check_exporter_form` checks the form only and never imports anything: it is what the
launcher runs (``traceml run``, ``traceml serve``) before it starts the aggregator.
:func:`load_exporter` runs in the aggregator process, on its main thread, before the export worker
thread exists: it imports the module, reads the attribute and calls ``factory(context)``.
:func:`make_export_worker` puts both together with the stream selection.

Every way a factory can fail (the module not found, or found but raising while imported, a missing
attribute, any exception from the module or the factory, ``SystemExit`` and ``KeyboardInterrupt``
included, a factory returning None) becomes an :class:`ExporterLoadError`, which
the worker treats like an exporter whose ``open`` raised: logged once, recorded in
``finalization_warning.json``, and the run goes on.
"""

from __future__ import annotations

import importlib
import keyword
from pathlib import Path
from typing import Any

from traceml_ai.aggregator.export.exporter import Exporter, ExporterContext
from traceml_ai.aggregator.export.streams import parse_export_streams
from traceml_ai.aggregator.export.worker import ExportWorker

BUILTIN_EXPORTERS = ("jsonl", "otlp")


class ExporterLoadError(Exception):
    """A ``module:factory`` exporter (or ``otlp`` without its extra) could not be made; one line."""


def _identifier(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)


def check_exporter_form(value: str) -> str:
    """``value`` when it is ``jsonl``, ``otlp`` or ``module:factory`` (a dotted module path, a colon
    and one identifier); the module is not imported.

    Raises:
        ValueError: any other form; the one-line message says what is accepted.
    """
    if value in BUILTIN_EXPORTERS:
        return value
    module, colon, attr = value.partition(":")
    if colon and module and all(_identifier(p) for p in module.split(".")) and _identifier(attr):
        return value
    raise ValueError(f"exporter {value!r} is not jsonl, otlp or module:factory "
                     "(a dotted module path, a colon and one identifier, e.g. my_exporters:make_exporter)")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_the_module(missing: str | None, module_name: str) -> bool:
    """Whether a ModuleNotFoundError for ``missing`` means ``module_name`` itself (or a package on its
    path) was not found, rather than something the module imports."""
    return missing is not None and (missing == module_name or module_name.startswith(missing + "."))


def _import(module_name: str) -> Any:
    """``importlib.import_module(module_name)``, every failure as one :class:`ExporterLoadError` line.

    A module that is not found is told apart from a module that was found but raised while being
    imported (its own error, or a package it imports that is missing, named as such).
    """
    try:
        return importlib.import_module(module_name)
    except GeneratorExit:
        raise
    except ModuleNotFoundError as exc:
        if _is_the_module(exc.name, module_name):
            raise ExporterLoadError(f"cannot import {module_name}: {_describe(exc)} "
                                    "(install it, or put its folder on PYTHONPATH)") from None
        needed = f"{exc.name!r}, which is not installed" if exc.name else "a module that is not installed"
        raise ExporterLoadError(f"module {module_name} was found but failed to import: it imports {needed} "
                                f"({_describe(exc)})") from None
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the module's, not the user's
        raise ExporterLoadError(f"module {module_name} was found but raised while being imported: "
                                f"{_describe(exc)}") from None


def load_exporter(value: str, context: ExporterContext) -> Exporter:
    """The exporter named by ``value``, made for ``context``.

    ``jsonl`` → :class:`~traceml_ai.aggregator.export.jsonl.JsonlExporter`; ``otlp`` →
    :class:`~traceml_ai.aggregator.export.otlp.OtlpExporter` (needs ``traceml-ai[otlp]``);
    ``module:factory`` → ``importlib.import_module(module).factory(context)``. The returned object
    is not checked: a missing method fails when the worker first calls it.

    Raises:
        ValueError: ``value`` is not of one of these forms (:func:`check_exporter_form`).
        ExporterLoadError: the module is not found, or raised while being imported (a missing
            package it imports is named), has no such attribute, the factory raised (any
            ``BaseException`` but ``GeneratorExit``: ``SystemExit`` and ``KeyboardInterrupt`` included),
            or the factory returned None.
    """
    check_exporter_form(value)
    if value == "jsonl":
        from traceml_ai.aggregator.export.jsonl import JsonlExporter

        return JsonlExporter.from_context(context)
    if value == "otlp":
        try:
            from traceml_ai.aggregator.export.otlp import OtlpExporter
        except ImportError as exc:
            raise ExporterLoadError(f"the otlp exporter needs OpenTelemetry: pip install 'traceml-ai[otlp]' "
                                    f"({_describe(exc)})") from None
        return OtlpExporter.from_context(context)
    module_name, _, attr = value.partition(":")
    module = _import(module_name)
    try:
        factory: Any = getattr(module, attr)
    except AttributeError:
        raise ExporterLoadError(f"module {module_name} has no attribute {attr!r}") from None
    except GeneratorExit:
        raise
    except BaseException as exc:  # a module __getattr__ may raise anything
        raise ExporterLoadError(f"reading {value} raised {_describe(exc)}") from None
    try:
        exporter = factory(context)
    except GeneratorExit:
        raise
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the factory's, not the user's
        raise ExporterLoadError(f"{value}(context) raised {_describe(exc)}") from None
    if exporter is None:
        raise ExporterLoadError(f"{value}(context) returned None instead of an exporter")
    return exporter  # type: ignore[no-any-return]


def make_export_worker(
    value: str,
    session_root: Path,
    *,
    export_streams: str,
    include_hostname: bool = False,
    **worker_options: Any,
) -> ExportWorker:
    """The export worker of a run folder, with its exporter made (call on the main thread).

    A factory that fails gives a worker without an exporter that reports the failure when it starts.

    Raises:
        ValueError: ``value`` is not of an accepted form, or ``export_streams`` is unknown or names
            no stream (the message lists the supported names).
    """
    check_exporter_form(value)
    streams = parse_export_streams(export_streams)
    context = ExporterContext.for_run(Path(session_root), include_hostname=include_hostname, streams=streams)
    try:
        exporter = load_exporter(value, context)
    except ExporterLoadError as exc:
        return ExportWorker(None, name=value, streams=streams, failure=str(exc), **worker_options)
    return ExportWorker(exporter, name=value, streams=streams, **worker_options)
