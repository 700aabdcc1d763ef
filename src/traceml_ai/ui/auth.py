"""Who may talk to the viewer, and what the browser may do with its pages (DESIGN §4; 003 seed,
"Security and resource use").

- Every request needs the random token printed with the URL. The first visit carries it as
  ``?token=...``; the response sets an HttpOnly, SameSite=Strict cookie and redirects to the same
  path without the token, so it does not linger in the address bar or the history.
- A Host header other than the viewer's own address is refused (DNS-rebinding guard).
- Every response carries a strict Content-Security-Policy: only the app's own scripts, styles and
  connections; no inline scripts or event handlers, no remote resources, no framing.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware) so server-sent events stream untouched.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

COOKIE = "traceml_token"
HEADER = "x-traceml-token"

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
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").lower()  # host names are case-insensitive
        if host not in {h.lower() for h in self.allowed_hosts()}:
            await _plain(send, 403, "forbidden: this viewer only answers requests addressed to itself")
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        given = query.get("token")
        valid = given is not None and secrets.compare_digest(given.encode(), self.token.encode())
        if valid and scope.get("path", "/").startswith("/api/"):
            # A script calling the API with ?token= gets the data, not a redirect.
            await self.app(scope, receive, _with_security_headers(send))
            return
        if valid:
            rest = {k: v for k, v in query.items() if k != "token"}
            location = scope.get("path", "/") + (f"?{urlencode(rest)}" if rest else "")
            cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await _send(send, 303, b"", [(b"location", location.encode()), (b"set-cookie", cookie.encode())])
            return
        if not self._authorised(headers):
            await _plain(send, 403, "forbidden: open the URL printed by `traceml ui` (it carries the token)")
            return

        await self.app(scope, receive, _with_security_headers(send))

    def _authorised(self, headers: dict[str, str]) -> bool:
        candidates = [headers.get(HEADER, "")]
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except Exception:
            pass
        if COOKIE in cookie:
            candidates.append(cookie[COOKIE].value)
        return any(c and secrets.compare_digest(c.encode(), self.token.encode()) for c in candidates)


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
