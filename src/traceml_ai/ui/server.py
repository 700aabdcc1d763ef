"""Running the viewer: bind a socket on 127.0.0.1, print the URL with its token, open a browser,
serve with uvicorn until Ctrl+C (DESIGN §4)."""

from __future__ import annotations

import socket
import threading
import webbrowser
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.auth import new_token
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer
from traceml_ai.ui.warm import Progress, scan_progress


def allowed_hosts_for(host: str, port: int) -> set[str]:
    """Host header values that address this viewer (``127.0.0.1:P``, ``localhost:P``, ...)."""
    names = {host, "127.0.0.1", "localhost"} if host in ("127.0.0.1", "localhost") else {host}
    if host in ("::1", "[::1]"):
        names = {"[::1]", "localhost"}
    return {f"{name}:{port}" for name in names}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; ``port`` 0 picks a free one. Raises OSError (e.g. port in use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


SHUTDOWN_GRACE_S = 2
"""After Ctrl+C, how long requests still open get before they are cancelled (the pages' event
streams are ended at once, see :class:`_Server`)."""


class _Server(uvicorn.Server):
    """uvicorn's server, ending the pages' event streams as soon as it is asked to stop: they never
    end by themselves, and uvicorn would wait for them."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def serve(
    roots: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    open_browser: bool = True,
    cache_dir: str | None = None,
    stale_after_seconds: float = 60.0,
    max_metrics_file_mb: float = 64.0,
    refresh_interval_seconds: float = 5.0,
    max_points_per_series: int = 5000,
    announce: Callable[[str], None] = print,
    progress: Progress | None = None,
) -> None:
    """Serve the viewer for ``roots`` until interrupted. ``progress`` is told how far a first scan
    without a run database is while it lasts (:func:`~traceml_ai.ui.warm.scan_progress`).

    Raises:
        NoRootError: no root exists. OSError: the port cannot be bound. CacheError: the cache
        folder is inside a run folder.
    """
    store = RunStore(roots, stale_after_seconds=stale_after_seconds, max_metrics_file_mb=max_metrics_file_mb)
    cache = CacheFolder(cache_dir, roots=roots) if cache_dir else None
    viewer = Viewer(
        store, cache, refresh_interval_seconds=refresh_interval_seconds, max_points_per_series=max_points_per_series
    )
    viewer.start()
    if not store.runs():
        with scan_progress(store, progress):  # (minutes from a cold disk at 100,000 runs)
            viewer.poll()  # no run database: scan now so the first page is complete
    else:
        threading.Thread(target=viewer.poll, name="traceml-first-poll", daemon=True).start()
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    token = new_token()
    app = create_app(viewer, token, lambda: allowed_hosts_for(host, bound))
    shown_host = f"[{host.strip('[]')}]" if ":" in host else host
    url = f"http://{shown_host}:{bound}/?token={token}"
    announce(url)
    # Open pages hold a server-sent-events stream that never ends by itself: Ctrl+C must not wait for them.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    server = _Server(config, viewer.end_streams)
    if open_browser:
        threading.Timer(0.5, lambda: webbrowser.open(url)).start()
    server.run(sockets=[sock])
