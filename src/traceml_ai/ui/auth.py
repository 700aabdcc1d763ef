"""Who may talk to the viewer, and what the browser may do with its pages (DESIGN §4; 003 seed,
"Security and resource use").

- Every request needs the random token printed with the URL. The first visit carries it as
  ``?token=...``; the response sets an HttpOnly, SameSite=Strict cookie and redirects to the same
  path without the token, so it does not linger in the address bar or the history. The redirect
  goes only to a path on this server (``//evil.example/?token=T`` lands on ``/evil.example/``).
- The cookie is named per port (``traceml_token_<port>``): browsers send cookies to every port of
  a host, so two viewers in one browser must not overwrite each other's.
- A Host header other than the viewer's own address (name and port) is refused, an empty one too
  (DNS-rebinding guard). This exact ``name:port`` check runs first; Starlette's
  ``TrustedHostMiddleware`` behind it checks the name again (:func:`guard`).
- Requests other pages make: a request whose ``Origin`` is not this viewer's, or that the browser
  marks as coming from another site or another port (``Sec-Fetch-Site: same-site`` or
  ``cross-site``, other than a top-level navigation) is refused. Every state-changing request
  (POST, PUT, PATCH, DELETE) must carry ``Content-Type: application/json`` and, when it is
  authorised by the cookie, an ``Origin`` of this viewer: a form or a page on another local port
  cannot hide a run or write an export.
- A request path with a control character (NUL, CR, LF) is answered 400.
- Every response carries a strict Content-Security-Policy: only the app's own scripts, styles and
  connections; no inline scripts or event handlers, no remote resources, no framing.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware) so server-sent events stream untouched;
headers, cookies and the query string are parsed by Starlette (``HTTPConnection``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, urlencode

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp as StarletteApp

COOKIE = "traceml_token"
"""The cookie's name prefix; the name is ``traceml_token_<port>`` (:func:`cookie_name`)."""
HEADER = "x-traceml-token"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]

ASGIApp = Callable[[dict[str, Any], Callable[..., Any], Callable[..., Any]], Any]


def new_token() -> str:
    """A random token of 32 URL-safe characters (192 bits)."""
    return secrets.token_urlsafe(24)


def cookie_name(host: str) -> str:
    """The token cookie's name for a viewer addressed as ``host`` (``name:port``): one per port."""
    _name, sep, port = host.rpartition(":")
    return f"{COOKIE}_{port}" if sep and port.isdigit() else COOKIE


def _token_matches(given: str | None, token: str) -> bool:
    """Constant-time: ``given`` is exactly ``token`` (None and empty never match)."""
    if not given:
        return False
    return secrets.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def same_server_location(path: str, query: str) -> str:
    """A ``Location`` that can only name a path on this server: leading slashes and backslashes
    are collapsed (``//evil.example/`` would be another host), the path is percent-encoded."""
    clean = "/" + path.lstrip("/\\")
    location = quote(clean, safe="/:@-._~!$&'()*+,;=")
    return location + (f"?{query}" if query else "")


class GuardMiddleware:
    """Token, Host and security headers for every HTTP request.

    Args:
        app: the ASGI app to guard.
        token: the secret every request must carry.
        allowed_hosts: a callable returning the Host header values accepted (e.g.
            ``{"127.0.0.1:8765", "localhost:8765"}``); a callable because the port is known only
            once the socket is bound.
    """

    def __init__(self, app: ASGIApp, token: str, allowed_hosts: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
            await _plain(send, 400, "bad request: the path holds a control character")
            return
        conn = HTTPConnection(scope)
        headers = conn.headers
        host = headers.get("host", "").strip().lower()  # host names are case-insensitive
        if not host or host not in {h.lower() for h in self.allowed_hosts()}:
            await _plain(send, 403, "forbidden: this viewer only answers requests addressed to itself")
            return
        refusal = _foreign_page(scope, headers, host)
        if refusal is not None:
            await _plain(send, 403, f"forbidden: {refusal}")
            return
        cookie = cookie_name(host)
        given = conn.query_params.getlist("token")
        if given:
            # Every token given must be this viewer's: ``?token=bad&token=GOOD`` is refused too.
            if not all(_token_matches(v, self.token) for v in given):
                await _plain(send, 403, "forbidden: that token is not this viewer's (open the URL of `traceml ui`)")
                return
            if path.startswith("/api/"):
                # A script calling the API with ?token= gets the data, not a redirect.
                await self._call(scope, receive, send, headers, by_cookie=False)
                return
            rest = {k: v for k, v in conn.query_params.multi_items() if k != "token"}
            location = same_server_location(path, urlencode(rest))
            value = f"{cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await _send(send, 303, b"", [(b"location", location.encode("latin-1")), (b"set-cookie", value.encode())])
            return
        way = self._authorised(conn, cookie)
        if way is None:
            await _plain(send, 403, "forbidden: open the URL printed by `traceml ui` (it carries the token)")
            return
        await self._call(scope, receive, send, headers, by_cookie=way == "cookie")

    async def _call(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any],
                    headers: Headers, *, by_cookie: bool) -> None:
        method = str(scope.get("method", "GET")).upper()
        if method in STATE_CHANGING:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                await _plain(send, 415, "unsupported media type: a request that changes something must be "
                                        "application/json")
                return
            if by_cookie and "origin" not in headers:
                await _plain(send, 403, "forbidden: a request that changes something must come from this "
                                        "viewer's page (no Origin header)")
                return
        await self.app(scope, receive, _with_security_headers(send))

    def _authorised(self, conn: HTTPConnection, cookie_key: str) -> str | None:
        """``"header"`` or ``"cookie"``: how the request proved it holds the token; None: it did not."""
        sent = conn.headers.getlist(HEADER)
        if sent:  # a wrong header is refused even beside a valid cookie or another, right header
            return "header" if all(_token_matches(v, self.token) for v in sent) else None
        if _token_matches(conn.cookies.get(cookie_key), self.token):
            return "cookie"
        return None


def guard(app: StarletteApp, token: str, allowed_hosts: Callable[[], Iterable[str]]) -> GuardMiddleware:
    """``app`` behind Starlette's ``TrustedHostMiddleware`` (the host names of ``allowed_hosts``,
    ports dropped) and, on top, the stricter :class:`GuardMiddleware` (exact ``name:port``, token,
    foreign pages, security headers)."""
    names = sorted({_host_name(h) for h in allowed_hosts()})
    return GuardMiddleware(TrustedHostMiddleware(app, allowed_hosts=names, www_redirect=False), token, allowed_hosts)


def _host_name(host: str) -> str:
    """``127.0.0.1:8765`` → ``127.0.0.1``; ``[::1]:8765`` → ``[::1]`` (Starlette keeps the brackets)."""
    name, sep, port = host.rpartition(":")
    return name.lower() if sep and port.isdigit() and not name.endswith(":") else host.lower()


def _foreign_page(scope: dict[str, Any], headers: Headers, host: str) -> str | None:
    """Why the request comes from a page that is not this viewer's (one line), or None."""
    origin = headers.get("origin")
    if origin is not None and origin.strip().lower() not in (f"http://{host}", f"https://{host}"):
        return f"a request from another origin ({origin[:80]!r}) is not answered"
    site = headers.get("sec-fetch-site", "").strip().lower()
    mode = headers.get("sec-fetch-mode", "").strip().lower()
    if site in ("same-site", "cross-site") and not (mode == "navigate" and scope.get("method", "GET") == "GET"):
        return "a request made by a page of another site or port is not answered"
    return None


def _with_security_headers(send: Callable[..., Any]) -> Callable[..., Any]:
    async def send_with_headers(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
        await send(message)

    return send_with_headers


async def _send(send: Callable[..., Any], status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, *SECURITY_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Callable[..., Any], status: int, text: str) -> None:
    await _send(send, status, text.encode(), [(b"content-type", b"text/plain; charset=utf-8")])
