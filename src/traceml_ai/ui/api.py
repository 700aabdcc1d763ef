"""The JSON API routes (docs/viewer-api.md). Each handler parses, calls :class:`Viewer`, encodes.

Blocking work (file reads, parsing) runs in a worker thread so one slow file system never stalls
the event loop that streams events to the page.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from traceml_ai.runs.store import NotFoundError
from traceml_ai.runs.table import ColumnError
from traceml_ai.runs.writer import iso_utc
from traceml_ai.ui.cache import CacheError
from traceml_ai.ui.catalog_view import CATALOG_COLUMN, AttachmentRefused
from traceml_ai.ui.service import END_OF_STREAM, MAX_FILE_BYTES, MAX_FIRST_ROWS, RequestError, Viewer

if TYPE_CHECKING:  # (imported when first needed: TelemetrySide)
    from traceml_ai.ui.perf_page import PerformancePageViews
    from traceml_ai.ui.performance import CompareViews, PerformanceViews
    from traceml_ai.ui.telemetry import TelemetryViews

MAX_BODY_BYTES = 1024 * 1024
"""The largest body of a request that names no runs (Refresh, the remembered view, a panel export)."""
MAX_KEYS_BODY_BYTES = 64 * 1024 * 1024
"""The largest body of a request that lists run keys (series, charts, hide, the table's CSV export):
every run of the table may be in it, and a key is the run folder's full path (the CSV export of
100,000 runs sends about 10 MB; it was refused above 13,000 rows, review 16a)."""
log = logging.getLogger("traceml.ui")
PING_EVERY_S = 15.0


class JSONResponse(Response):
    """orjson-encoded JSON; NaN and ±infinity become null, numpy arrays are lists."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _dumps(content)


def _dumps(content: Any) -> bytes:
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str)


class TelemetrySide:
    """The answer builders of the telemetry side (inspector, Performance view, compare), made when
    first needed: their modules (the diagnosis, numpy, the step tables) are ~0.15 s of imports that
    the run table's first answer does without (issue 16). The app makes them in the background
    once it serves (:meth:`prepare`), so the first Performance view does not wait for them either
    (issue 13); a request that comes first makes them on its worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: TelemetryBuilders | None = None

    def prepare(self) -> None:
        """Make the builders on a daemon thread (returns at once), and import the request models
        the POST routes check their bodies with (pydantic, ~0.09 s) on it too."""
        threading.Thread(target=self.prepare_now, name="traceml-telemetry-side", daemon=True).start()

    def prepare_now(self) -> None:
        """What :meth:`prepare` does, on this thread (returns when done)."""
        import traceml_ai.ui.requests  # noqa: F401

        self.get()

    def get(self) -> TelemetryBuilders:
        """The builders (one set per app), made at the first call."""
        with self._lock:
            if self._made is None:
                from traceml_ai.ui.perf_page import PerformancePageViews
                from traceml_ai.ui.performance import CompareViews, PerformanceViews
                from traceml_ai.ui.telemetry import TelemetryViews

                telemetry, performance = TelemetryViews(), PerformanceViews()
                self._made = TelemetryBuilders(telemetry, performance, CompareViews(),
                                               PerformancePageViews(telemetry, performance))
            return self._made


@dataclass(frozen=True)
class TelemetryBuilders:
    """What :meth:`TelemetrySide.get` makes: the answers of the inspector's telemetry, the per-rank
    view, compare, and the Performance page (which shares the first two)."""

    telemetry: TelemetryViews
    performance: PerformanceViews
    comparisons: CompareViews
    pages: PerformancePageViews


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object body, read no further than ``limit`` bytes (:data:`MAX_BODY_BYTES`,
    or :data:`MAX_KEYS_BODY_BYTES` for a request listing run keys): a larger ``Content-Length`` is
    refused before anything is read, and a body that runs past the limit is refused as soon as it
    does (the viewer never holds more than the limit of one request).

    Raises:
        RequestError: the body is too large, ends early, is not JSON, or not an object.
    """
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(f"request body too large (at most {limit} bytes)")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body too large (at most {limit} bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError("the client went away before its request body ended") from None
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise RequestError("request body is not JSON") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


Handler = Callable[[Request], Awaitable[Response]]


def routes(viewer: Viewer, side: TelemetrySide | None = None) -> list[Route]:
    """The API routes bound to ``viewer``; ``side``: the telemetry side's builders (a new set when None)."""

    def guarded(fn: Callable[[Request], Awaitable[Response]]) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                return await fn(request)
            except RequestError as err:
                return _error(400, str(err))
            except CacheError as err:
                return _error(400, str(err))
            except ColumnError as err:  # an unknown column in a table export or query: the caller's mistake
                return _error(400, str(err))
            except NotFoundError as err:  # our own "no such run/file"; a bare KeyError is a bug: 500
                return _error(404, str(err.args[0]) if err.args else "not found")
            except AttachmentRefused as err:
                return _error(403, str(err))
            except Exception:
                log.exception("[TraceML] %s %s failed", request.method, request.url.path)
                return _error(500, f"internal error in the TraceML viewer while answering {request.url.path} "
                                   "(its traceback is in the server's log)")

        return handler

    async def get_runs(request: Request) -> Response:
        since = _int(request.query_params.get("since", "0"), "since")
        if request.query_params.get("stream") in ("1", "true"):
            # One JSON object per line, made and sent a chunk of rows at a time (in a worker thread:
            # Starlette iterates a plain iterator there). docs/viewer-api.md, "Streamed listing".
            lines = (_dumps(obj) + b"\n" for obj in viewer.runs_chunks(since))
            return StreamingResponse(lines, media_type="application/x-ndjson", headers={"cache-control": "no-store"})
        return JSONResponse(await asyncio.to_thread(viewer.runs_payload, since))

    async def get_table(request: Request) -> Response:
        q = request.query_params
        rows = _int(q.get("rows", "0"), "rows")
        if not 0 <= rows <= MAX_FIRST_ROWS:
            raise RequestError(f"rows must be 0 to {MAX_FIRST_ROWS}, got {rows}")
        if q.get("remembered") in ("1", "true"):
            answer = await asyncio.to_thread(viewer.remembered_table_payload)
            return JSONResponse(await _with_rows(answer, rows))
        columns = q.get("columns")
        payload = await asyncio.to_thread(
            viewer.table_payload,
            filters=q.getlist("filter"),
            sorts=q.getlist("sort"),
            group=q.get("group") or None,
            search=q.get("search"),
            status=q.get("status"),
            columns=[c for c in columns.split(",") if c] if columns else None,
            show_hidden=q.get("show_hidden") in ("1", "true"),
        )
        return JSONResponse(await _with_rows(payload, rows))

    async def _with_rows(answer: dict[str, Any], n: int) -> dict[str, Any]:
        """A table answer with ``rows``, the rows of its first ``n`` runs as drawn (group by group):
        what the page needs to draw its first screen before its listing has arrived."""
        if not n:
            return answer
        groups = answer.get("groups")
        order = [k for g in groups for k in g["keys"]] if groups else answer["keys"]
        return {**answer, "rows": await asyncio.to_thread(viewer.rows_of, order[:n])}

    async def post_series(request: Request) -> Response:
        from traceml_ai.ui.requests import SeriesRequest, parse  # (pydantic: at the first POST, issue 16)

        body = parse(SeriesRequest, await _body(request, MAX_KEYS_BODY_BYTES))
        x_range = None if body.x_range is None else (body.x_range[0], body.x_range[1])
        payload = await asyncio.to_thread(viewer.series_payload, body.keys, body.metrics, body.x, body.ema, x_range,
                                          body.group_by)
        if viewer.cache is not None:  # charts are on screen: have matplotlib ready for a PNG export (once)
            from traceml_ai.ui.png import warm_up_in_background

            asyncio.get_running_loop().call_later(3.0, warm_up_in_background)  # after the first screen settles
        return JSONResponse(payload)

    async def post_chart(request: Request) -> Response:
        from traceml_ai.runs.analysis import ChartSpecError, chart_data, parse_chart_spec

        body = await _body(request, MAX_KEYS_BODY_BYTES)
        try:
            spec = parse_chart_spec(body)
        except ChartSpecError as err:
            raise RequestError(str(err)) from None
        if body.get("chart") == "line":
            raise RequestError("line charts come from POST /api/series")
        runs = viewer.runs_by_keys(list(spec.keys))
        return JSONResponse(await asyncio.to_thread(chart_data, spec, runs))  # type: ignore[arg-type]

    async def get_run(request: Request) -> Response:
        key = request.query_params.get("key", "")
        return JSONResponse(await asyncio.to_thread(viewer.details_payload, key))

    views = side if side is not None else TelemetrySide()

    async def run_view(request: Request, build: Callable[[Any], dict[str, Any]]) -> Response:
        # The key is a known run's key, looked up in the store; nothing the client sends becomes a path.
        key = request.path_params["key"]
        run = viewer.store.get(key)
        if run is None:
            raise NotFoundError(f"no run {key!r}")
        return JSONResponse(await asyncio.to_thread(build, run), headers={"cache-control": "no-store"})

    async def get_telemetry(request: Request) -> Response:
        return await run_view(request, lambda run: views.get().telemetry.payload(run))

    async def get_performance(request: Request) -> Response:
        return await run_view(request, lambda run: views.get().performance.payload(run))

    async def get_performance_page(request: Request) -> Response:
        lo, hi = request.query_params.get("from"), request.query_params.get("to")
        if lo is None and hi is None:
            return await run_view(request, lambda run: views.get().pages.payload(run))
        steps = (_float(lo or "", "from"), _float(hi or "", "to"))
        return await run_view(request, lambda run: views.get().pages.zoomed(run, *steps))

    async def get_compare(request: Request) -> Response:
        base = viewer.store.get(request.query_params.get("baseline", ""))
        if base is None:
            raise NotFoundError(f"no run {request.query_params.get('baseline', '')!r}")
        return await run_view(request, lambda run: views.get().comparisons.payload(base, run))

    async def export_performance(request: Request) -> Response:
        from traceml_ai.ui.perf_export import PanelError, export_panel
        from traceml_ai.ui.requests import ExportPerformanceRequest, parse  # (pydantic: at the first POST, issue 16)

        body = parse(ExportPerformanceRequest, await _body(request))
        if viewer.cache is None:
            raise RequestError("this viewer has no cache folder to write exports into")
        run = viewer.store.get(body.key)
        if run is None:
            raise NotFoundError(f"no run {body.key!r}")
        try:
            path = await asyncio.to_thread(
                export_panel, viewer.cache, run, body.panel, body.format, share=body.share, heat=body.heat
            )
        except PanelError as err:
            raise RequestError(str(err)) from None
        return JSONResponse({"path": path})

    async def get_file(request: Request) -> Response:
        q = request.query_params
        text = await asyncio.to_thread(viewer.file_text, q.get("key", ""), q.get("name", ""))
        return PlainTextResponse(text, headers={"cache-control": "no-store"})

    async def get_export(request: Request) -> Response:
        # A CSV/PNG this viewer wrote into its cache folder, shown read-only (export bar "Open").
        if viewer.cache is None:
            raise RequestError("this viewer has no cache folder")
        data, media = await asyncio.to_thread(viewer.cache.read_export, request.query_params.get("name", ""))
        return Response(data, media_type=media,
                        headers={"cache-control": "no-store", "x-content-type-options": "nosniff"})

    async def get_attachments(request: Request) -> Response:
        # The key is a known run's key; the answer names local files by token, never by path.
        key = request.path_params["key"]
        if viewer.store.get(key) is None:
            raise NotFoundError(f"no run {key!r}")
        payload = await asyncio.to_thread(viewer.catalog.attachments_payload, key)  # stats each local file
        return JSONResponse(payload, headers={"cache-control": "no-store"})

    async def get_attachment(request: Request) -> Response:
        text = await asyncio.to_thread(viewer.catalog.attachment_text, request.path_params["token"], MAX_FILE_BYTES)
        return PlainTextResponse(text, headers={"cache-control": "no-store", "x-content-type-options": "nosniff"})

    async def post_refresh(request: Request) -> Response:
        from traceml_ai.ui.requests import RefreshRequest, parse  # (pydantic: at the first POST, issue 16)

        body = parse(RefreshRequest, await _body(request))
        await asyncio.to_thread(viewer.poll, refresh=True)
        return JSONResponse(await asyncio.to_thread(viewer.runs_payload, body.since))

    async def post_hide(request: Request) -> Response:
        from traceml_ai.ui.requests import HideRequest, parse  # (pydantic: at the first POST, issue 16)

        body = parse(HideRequest, await _body(request, MAX_KEYS_BODY_BYTES))
        return JSONResponse({"hidden": await asyncio.to_thread(viewer.set_hidden, body.keys, body.hidden)})

    async def ui_state(request: Request) -> Response:
        if viewer.cache is None:
            return JSONResponse({} if request.method == "GET" else {"ok": False})
        if request.method == "GET":
            return JSONResponse(await asyncio.to_thread(viewer.cache.load_ui_state))
        body = await _body(request)
        await asyncio.to_thread(viewer.cache.save_ui_state, body)
        return JSONResponse({"ok": True})

    async def export_table(request: Request) -> Response:
        from traceml_ai.ui.requests import ExportTableRequest, parse  # (pydantic: at the first POST, issue 16)

        body = parse(ExportTableRequest, await _body(request, MAX_KEYS_BODY_BYTES))
        if viewer.cache is None:
            raise RequestError("this viewer has no cache folder to write exports into")
        runs = viewer.runs_by_keys(body.keys)
        columns = [c for c in body.columns if c != CATALOG_COLUMN]  # not a runs.table column
        path, latest = await asyncio.to_thread(viewer.cache.export_table_csv, runs, columns)
        return JSONResponse({"path": path, "latest": latest, "rows": len(runs)})

    async def export_chart(request: Request) -> Response:
        from traceml_ai.runs.analysis import ChartSpecError, parse_chart_spec

        body = await _body(request, MAX_KEYS_BODY_BYTES)
        if viewer.cache is None:
            raise RequestError("this viewer has no cache folder to write exports into")
        fmt = body.get("format", "png")
        if fmt not in ("png", "csv"):
            raise RequestError("format must be png or csv")
        try:
            spec = parse_chart_spec(body)
        except ChartSpecError as err:
            raise RequestError(str(err)) from None
        path = await asyncio.to_thread(viewer.export_chart, spec, fmt)
        return JSONResponse({"path": path})

    async def events(request: Request) -> Response:
        queue = viewer.subscribe()
        asyncio.get_running_loop().run_in_executor(None, viewer.poll)  # a page connected: look now

        async def stream() -> Any:
            try:
                yield f"event: hello\ndata: {orjson.dumps({'version': viewer.version}).decode()}\n\n"
                while True:
                    try:
                        version = await asyncio.wait_for(queue.get(), timeout=PING_EVERY_S)
                    except asyncio.TimeoutError:
                        yield ": ping\n\n"
                        continue
                    while not queue.empty() and version != END_OF_STREAM:  # coalesce a burst into one event
                        version = queue.get_nowait()
                    if version == END_OF_STREAM:
                        return  # the server is stopping
                    # Sent after every poll, changed or not: `refreshed_at` is when the poll ran.
                    polled = viewer.refreshed_at
                    data = {"version": version, "refreshed_at": iso_utc(polled) if polled else None}
                    yield f"event: runs\ndata: {orjson.dumps(data).decode()}\n\n"
            finally:
                viewer.unsubscribe(queue)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
        )

    return [
        Route("/api/runs", guarded(get_runs), methods=["GET"]),
        Route("/api/table", guarded(get_table), methods=["GET"]),
        Route("/api/series", guarded(post_series), methods=["POST"]),
        Route("/api/chart", guarded(post_chart), methods=["POST"]),
        Route("/api/run", guarded(get_run), methods=["GET"]),
        Route("/api/file", guarded(get_file), methods=["GET"]),
        Route("/api/export/file", guarded(get_export), methods=["GET"]),
        Route("/api/runs/{key:path}/telemetry", guarded(get_telemetry), methods=["GET"]),
        Route("/api/runs/{key:path}/performance", guarded(get_performance), methods=["GET"]),
        Route("/api/runs/{key:path}/performance-page", guarded(get_performance_page), methods=["GET"]),
        Route("/api/runs/{key:path}/compare", guarded(get_compare), methods=["GET"]),
        Route("/api/runs/{key:path}/attachments", guarded(get_attachments), methods=["GET"]),
        Route("/api/attachments/{token}", guarded(get_attachment), methods=["GET"]),
        Route("/api/events", events, methods=["GET"]),
        Route("/api/refresh", guarded(post_refresh), methods=["POST"]),
        Route("/api/hide", guarded(post_hide), methods=["POST"]),
        Route("/api/ui-state", guarded(ui_state), methods=["GET", "PUT"]),
        Route("/api/export/table", guarded(export_table), methods=["POST"]),
        Route("/api/export/chart", guarded(export_chart), methods=["POST"]),
        Route("/api/export/performance", guarded(export_performance), methods=["POST"]),
    ]


def _float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RequestError(f"{name} must be a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise RequestError(f"{name} must be a finite number")
    return value


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RequestError(f"{name} must be an integer") from None
