"""The viewer app, composed in one place (STYLE: "``traceml_ai.ui.app`` composes routes and
middleware"): the JSON API, the static front end, the token/Host/CSP guard, and the poll loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from traceml_ai.ui.api import TelemetrySide, routes
from traceml_ai.ui.auth import GuardMiddleware, guard
from traceml_ai.ui.service import Viewer

STATIC_DIR = Path(__file__).parent / "static"

_NOT_BUILT = """<!doctype html><html><head><meta charset="utf-8"><title>TraceML</title></head>
<body><h1>TraceML</h1><p>The viewer's front end is not built. Reinstall the package
(<code>pip install -e .</code> builds it with npm), or run <code>npm ci &amp;&amp; npm run build</code>
in <code>web/</code>.</p></body></html>"""


def create_app(
    viewer: Viewer, token: str, allowed_hosts: Callable[[], Iterable[str]], *, static_dir: Path = STATIC_DIR
) -> GuardMiddleware:
    """The ASGI app for ``viewer``, guarded by ``token`` and the Host allow-list.

    The poll loop starts with the app and stops with it; it polls only while a page is connected.
    """

    async def index(request: Request) -> Response:
        page = static_dir / "index.html"
        if not page.is_file():
            return HTMLResponse(_NOT_BUILT)
        return FileResponse(page, headers={"cache-control": "no-store"})

    side = TelemetrySide()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        side.prepare()
        task = asyncio.create_task(viewer.poll_loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.to_thread(viewer.close)

    app_routes: list[BaseRoute] = [Route("/", index), *routes(viewer, side)]
    if static_dir.is_dir():
        app_routes.append(Mount("/static", StaticFiles(directory=static_dir), name="static"))
    app = Starlette(routes=app_routes, lifespan=lifespan)
    return guard(app, token, allowed_hosts)
