"""The browser page at `/`, and which token URLs it may use (`--token-url-origin`).

The page (web/) asks a token URL for an ephemeral secret before a call. It accepts only this
agent's own `/v1/realtime/client_secrets`, or a URL on an origin the operator allowed with
`--token-url-origin ORIGIN` (repeatable: `https://host[:port]`, or an `http://` loopback
origin for development: 127.0.0.1, localhost, [::1]). The page learns the allowed origins
from `<meta name="token-url-origins">` in the HTML this module serves, filled in here; no
authenticated route is involved, so the page needs no secret to know them.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from agent.cli_errors import exit_with_error
from signaling.errors import json_error

ORIGINS_KEY = web.AppKey("token_url_origins", tuple)
PAGE_PATH_KEY = web.AppKey("page_path", Path)
META_PLACEHOLDER = '<meta name="token-url-origins" content="">'
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_PORTS = {"https": 443, "http": 80}
FLAG = "--token-url-origin"


def web_dir() -> Path:
    """The page's folder: `signaling/web/` inside an installed wheel (pyproject.toml maps the
    top-level web/ there), else the top-level web/ next to this package (a source checkout or
    `pip install -e .`)."""
    package = Path(__file__).resolve().parent
    packaged = package / "web"
    return packaged if packaged.is_dir() else package.parent / "web"


def _host(hostname: str) -> str:
    """The host as a browser's URL.origin writes it (IPv6 compressed, in brackets)."""
    if ":" in hostname:
        try:
            return f"[{ipaddress.IPv6Address(hostname).compressed}]"
        except ValueError:
            raise ValueError(f"{hostname!r} is not an IPv6 address") from None
    if not hostname or not all(c.isascii() and (c.isalnum() or c in ".-") for c in hostname):
        raise ValueError("the host must be a plain DNS name or IP address "
                         "(an international name in its xn-- form)")
    return hostname


def normalized_origin(text: str) -> str:
    """`https://host[:port]` (or http on loopback) as browsers serialize it; ValueError
    says why anything else is refused."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not an origin ({exc})") from None
    scheme, hostname = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not parts.netloc:
        raise ValueError("give an origin such as https://app.example or https://app.example:8443")
    if parts.username is not None or parts.password is not None:
        raise ValueError("an origin has no user name or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("an origin has no path, query or fragment (just scheme://host[:port])")
    host = _host(hostname)
    if scheme == "http" and host.strip("[]") not in LOOPBACK_HOSTS:
        raise ValueError("http is accepted only on loopback (127.0.0.1, localhost, [::1]); "
                         "use https")
    suffix = "" if port is None or port == DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{host}{suffix}"


def normalized_origins(origins: Sequence[str]) -> tuple[str, ...]:
    """Each origin normalized, duplicates dropped; ValueError names the first bad one."""
    result: list[str] = []
    for origin in origins:
        try:
            value = normalized_origin(origin)
        except ValueError as exc:
            raise ValueError(f"{FLAG} {origin!r}: {exc}") from None
        if value not in result:
            result.append(value)
    return tuple(result)


class _OriginAction(argparse.Action):
    """Appends a normalized origin; a bad one ends start-up with one coded line, before
    any plugin loads or worker starts."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        text = str(values)
        try:
            origin = normalized_origin(text)
        except ValueError as exc:
            exit_with_error("token_url_origin_invalid", f"{FLAG} {text!r}: {exc}", cause=exc)
        current = list(getattr(namespace, self.dest, None) or [])
        if origin not in current:
            current.append(origin)
        setattr(namespace, self.dest, current)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG, action=_OriginAction, default=None, metavar="ORIGIN", dest="token_url_origin",
        help="origin whose URLs the browser page may use as its token URL, e.g. "
        "https://app.example (repeatable; https, or http on 127.0.0.1/localhost/[::1]; "
        "default: none, only this agent's own /v1/realtime/client_secrets)",
    )


def origins_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(getattr(args, "token_url_origin", None) or ())


def render(page_html: str, origins: Sequence[str]) -> str:
    """The page with the allowed origins (space separated, HTML-escaped) in its meta tag."""
    content = html.escape(" ".join(origins), quote=True)
    return page_html.replace(META_PLACEHOLDER,
                             f'<meta name="token-url-origins" content="{content}">', 1)


async def index(request: web.Request) -> web.StreamResponse:
    path = request.app[PAGE_PATH_KEY]
    try:
        text = await asyncio.to_thread(path.read_text, encoding="utf-8")
    except FileNotFoundError:
        return json_error(404, "not_found", "no web page is installed")
    origins = request.app[ORIGINS_KEY]
    return web.Response(text=render(text, origins), content_type="text/html",
                        headers={"Cache-Control": "no-cache"})


def setup(app: web.Application, page_path: Path, origins: Sequence[str]) -> None:
    """Serve the page at `/`; ValueError for an origin the page could not safely use."""
    app[ORIGINS_KEY] = normalized_origins(origins)
    app[PAGE_PATH_KEY] = page_path
    app.router.add_get("/", index)
