"""Local by design: which requests the server answers at all.

A server on 127.0.0.1 is still reachable from any web page the user opens: a page can POST to
it (a `text/plain` "simple request" needs no preflight), and through DNS rebinding
(evil.example resolving to 127.0.0.1) read the answers. So, before any route runs:
- the Host header must name a loopback host (localhost, 127.x.x.x, ::1) or one the operator
  allows (`--allowed-hosts`): a rebound name is refused (HTTP/1.0 may leave it out: no browser
  does);
- a browser's cross-origin request (an Origin header other than the server's own) is refused
  unless `--cors` names that origin; allowed origins get CORS headers and preflights;
- POST bodies must be `application/json` (never a form or text/plain a page can send freely);
- with `--api-key`, every endpoint but /health needs `Authorization: Bearer <key>` or
  `x-api-key: <key>` (compared in constant time).
Forwarding headers (X-Forwarded-For) are trusted only from `--trust-proxy` addresses (uvicorn).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response

from ..errors import DFlash2Error
from .messages_output import MESSAGES_PATH, error_body
from .api_error import loggable
from .schemas import APIError

log = logging.getLogger("dflash2.serve")

OPEN_PATHS = ("/health",)  # answered without the API key (liveness probes)
PREFLIGHT_MAX_AGE = "600"
# What a page's script may read of a response besides the simple headers (the SDKs read these).
EXPOSED = {"Access-Control-Expose-Headers": "x-request-id, request-id, retry-after"}
# A preflight's requested header names are echoed whole (a name cut short blocks the request
# that follows); these bound what one preflight can make the server repeat.
PREFLIGHT_MAX_HEADERS = 100
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")


def preflight_headers(requested: str | None) -> str:
    """The Access-Control-Allow-Headers of a preflight: the requested names that are header
    names (RFC 9110 tokens), each whole; none requested: Authorization and Content-Type."""
    names = [n.strip() for n in (requested or "").split(",")]
    names = [n for n in names if _HEADER_NAME.fullmatch(n)][:PREFLIGHT_MAX_HEADERS]
    return ", ".join(names) if names else "authorization, content-type"


@dataclass(frozen=True)
class SecurityPolicy:
    """Resolved once from the command line (cli/serve.py) and passed to `create_app`.

    allowed_hosts: Host names/addresses answered besides loopback ones ("*": any).
    cors_origins: browser origins allowed cross-origin, e.g. "http://localhost:3000" ("*": any).
    api_key: the Bearer token every request but /health must carry (None: none needed).
    trusted_proxies: addresses whose X-Forwarded-For / -Proto headers are believed.
    """

    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    api_key: str | None = None
    trusted_proxies: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(
            self,
            "allowed_hosts",
            tuple(h.strip().lower().strip("[]") for h in self.allowed_hosts if h.strip()),
        )
        object.__setattr__(
            self,
            "cors_origins",
            tuple(o.strip().rstrip("/").lower() for o in self.cors_origins if o.strip()),
        )
        for origin in self.cors_origins:
            # "null": what file:// pages and sandboxed frames send (any such page matches it)
            if origin not in ("*", "null") and "://" not in origin:
                raise DFlash2Error(
                    f"--cors {origin!r}: an origin is scheme://host[:port], "
                    "e.g. http://localhost:3000 (or null for file:// pages, * for any)"
                )
        if self.api_key is not None:
            _check_key(self.api_key)
        for proxy in self.trusted_proxies:
            _check_proxy(proxy)

    def uvicorn_options(self) -> dict:
        """Forwarding headers: believed only from the trusted proxies (none by default)."""
        if not self.trusted_proxies:
            return {"proxy_headers": False}
        return {"proxy_headers": True, "forwarded_allow_ips": ",".join(self.trusted_proxies)}


def _check_key(key: str) -> None:
    """A key no client could send would lock every client out: refused at start."""
    if not key.strip():
        raise DFlash2Error("--api-key is empty")
    if key != key.strip():  # HTTP drops a header value's outer whitespace
        raise DFlash2Error(
            "--api-key (or DFLASH2_API_KEY) starts or ends with whitespace, which no client "
            "can send in a header: remove it"
        )
    if not (key.isascii() and key.isprintable()):
        raise DFlash2Error("--api-key must be printable ASCII (it travels in an HTTP header)")


def _check_proxy(entry: str) -> None:
    """An address or network (uvicorn would take anything else literally and match nothing)."""
    try:
        if entry.strip() != "*":
            ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise DFlash2Error(
            f"--trust-proxy {entry!r}: an IP address or network (10.0.0.0/8, ::1), or *"
        ) from None


_HOST_HEADER = re.compile(r"\[([0-9a-f:.]+)\](?::\d{1,5})?|([a-z0-9._-]+)(?::\d{1,5})?")


def host_of_header(header: str) -> str | None:
    """The host a Host header names ('name[:port]', '[v6][:port]' or a bare IPv6 address), in
    lower case; None for anything else ('a:1@b', 'a:port'), which no client sends."""
    header = header.strip().lower()
    found = _HOST_HEADER.fullmatch(header)
    if found:
        return found.group(1) or found.group(2)
    try:
        return str(ipaddress.IPv6Address(header))
    except ValueError:
        return None


def split_host(header: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


WILDCARDS = ("0.0.0.0", "::")


def hosts_for_bind(bind_host: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """`allowed` plus the address the server listens on (its clients name it in Host), unless
    that is a loopback or wildcard address."""
    bound = split_host(bind_host)
    if bound and bound not in WILDCARDS and not is_loopback(bound):
        return (*allowed, bound)
    return allowed


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SecurityGate:
    """ASGI middleware enforcing a SecurityPolicy (see the module docstring)."""

    def __init__(self, app, policy: SecurityPolicy):
        self.app, self.policy = app, policy
        self._key = policy.api_key.encode() if policy.api_key else None
        # origins refused so far (bounded): each one's first refusal is a warning, which a
        # user whose web page cannot reach the server sees at the default log level
        self._refused_origins: set[str] = set()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if sum(k.lower() == b"origin" for k, _ in scope["headers"]) > 1:  # the dict keeps
                # the last: no browser sends two, and a forged one could hide behind ours
                raise APIError(400, "more than one Origin header", code="origin_malformed")
            cors = self._check(scope, headers)
        except APIError as err:
            path, why = loggable(scope["path"], 200), loggable(err.message)
            level = self._level(err, headers.get("origin"))
            log.log(level, "refused %s %s: %s", scope["method"], path, why)
            body = error_body(err) if scope["path"].startswith(MESSAGES_PATH) else err.body()
            return await JSONResponse(body, err.status, err.headers)(scope, receive, send)
        if cors is None:
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            allow = preflight_headers(headers.get("access-control-request-headers"))
            return await Response(
                status_code=204,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": allow,
                    "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
                },
            )(scope, receive, send)
        extra = [(k.lower().encode(), v.encode()) for k, v in cors.items()]

        async def with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        return await self.app(scope, receive, with_cors)

    def _level(self, err: APIError, origin: str | None) -> int:
        """INFO, but WARNING for an origin's first refusal (of the first 64 origins)."""
        if err.code != "origin_not_allowed" or origin in self._refused_origins:
            return logging.INFO
        if len(self._refused_origins) >= 64:
            return logging.INFO
        self._refused_origins.add(origin)
        return logging.WARNING

    def _check(self, scope, headers: dict) -> dict | None:
        """Raise APIError to refuse; return the CORS headers for an allowed cross-origin
        request, else None."""
        p = self.policy
        host_header = headers.get("host") or ""
        if not host_header and scope.get("http_version") != "1.0":
            raise APIError(400, "the Host header is required", code="host_required")
        # HTTP/1.0 may leave it out (a simple probe): no browser does, so no rebinding risk
        host = host_of_header(host_header) if host_header else "localhost"
        if host is None:
            raise APIError(
                400, f"malformed Host header {host_header[:60]!r}", code="host_malformed"
            )
        if not (is_loopback(host) or "*" in p.allowed_hosts or host in p.allowed_hosts):
            raise APIError(
                403,
                f"Host {host[:60]!r} is not allowed: this server answers "
                "loopback names only unless started with --allowed-hosts",
                code="host_not_allowed",
            )
        cors = None
        origin = headers.get("origin")
        if origin is not None:
            own = origin.lower().rstrip("/") in (
                f"http://{host_header.lower()}",
                f"https://{host_header.lower()}",
            )
            if not own:
                if "*" not in p.cors_origins and origin.lower().rstrip("/") not in p.cors_origins:
                    named = origin.lower().rstrip("/")[:200]
                    raise APIError(
                        403,
                        f"cross-origin requests from {origin[:200]!r} are not allowed: to let "
                        f"a web page there use this server, add it to the server's --cors "
                        f"origins: --cors {named}",
                        code="origin_not_allowed",
                    )
                cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin", **EXPOSED}
        if scope["method"] == "OPTIONS":
            return cors
        if self._key is not None and scope["path"] not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
                token = headers.get("x-api-key", "")
            if not hmac.compare_digest(token.strip().encode("latin-1"), self._key):
                raise APIError(
                    401,
                    "a valid API key is required: Authorization: Bearer <key> (or x-api-key)",
                    type="authentication_error",
                    code="invalid_api_key",
                    headers={**(cors or {}), "WWW-Authenticate": "Bearer"},
                )
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                raise APIError(
                    415,
                    "the request body must be JSON sent as Content-Type: "
                    f"application/json; got {media[:60] or 'none'!r}",
                    code="unsupported_media_type",
                    headers=cors,
                )
        return cors
