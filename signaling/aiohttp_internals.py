"""The aiohttp internals signaling relies on, reached from this module only.

Kept here (like agent/rtc_tuning/ for aiortc) so an aiohttp upgrade that renames them breaks
in one place, and at start-up rather than on some later request:

- `requests_parsed(handler)`: how many request heads a connection has sent
  (`RequestHandler._request_count`); the header deadline in slow_clients.py closes a
  connection that has sent none.
- `refill_body(request, stream)`: a request's body stream replaced (`BaseRequest._payload`),
  after cluster/forwarding.py read the body to check a node's signature.
- `set_remote(request, address)`: the address a request reports as `request.remote`
  (`BaseRequest._cache`, where aiohttp caches it), for a request another worker forwarded
  (workers/channel.py).

`missing_internals()` names any of them the installed aiohttp lacks; the server refuses to
start then (`aiohttp_unsupported`, see signaling/__main__.py).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler


def requests_parsed(handler: RequestHandler) -> int:
    """Request heads parsed on this connection so far (aiohttp internal, stable since 3.0)."""
    return handler._request_count


def refill_body(request: web.Request, stream: StreamReader) -> None:
    """`request`'s body is read from `stream` from now on (aiohttp offers no public way)."""
    request._payload = stream


def set_remote(request: web.Request, address: str) -> None:
    """`request.remote` reads `address` from now on, for this very request object (what
    `request.clone(remote=...)` fills in a copy, which the access log would not see)."""
    request._cache["remote"] = address


def _has_attribute(cls: type, name: str) -> bool:
    """Whether instances of `cls` get `name`: a slot, or an attribute its __init__ sets."""
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if name in ((slots,) if isinstance(slots, str) else slots):
            return True
        init = klass.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None and name in code.co_names:
            return True
    return False


def missing_internals(handler_class: type = RequestHandler,
                      request_class: type = web.BaseRequest) -> list[str]:
    """The internals above that these aiohttp classes lack (empty: all present)."""
    wanted = ((handler_class, "_request_count"), (request_class, "_payload"),
              (request_class, "_cache"))
    return [f"{cls.__name__}.{name}" for cls, name in wanted if not _has_attribute(cls, name)]
