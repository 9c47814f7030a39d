"""Credentials out of anything printed or served: URLs, log lines, error messages.

Upstream URLs (`--upstream wss://user:pass@host/...?api_key=...`) and request paths
(`/v1/telephony/media-stream?token=KEY`) carry secrets. Anything the server writes to a log,
puts in `/health`, or sends a client goes through these pure functions first:
- `redact_url`: userinfo becomes `***@`; values of secret-looking query (and fragment)
  parameters become `***`; everything else is kept verbatim, so the URL stays recognisable.
- `redact_text`: the same for every URL and every `?name=value`/`&name=value` pair in free
  text, plus the segment after any of the given secret-bearing path prefixes. Paths are
  matched as the router sees them, percent-decoded: `/v1/telephony/media%2Dstream/KEY`
  reaches the same route as the plain spelling, so it is masked too (and written back in its
  plain, canonical spelling: `/v1/telephony/media-stream/***`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

from agent.logs.log_safe import printable

MASK = "***"
# Parameter names whose values are secrets, compared after lowercasing and dropping - and _.
SECRET_NAMES = frozenset({
    "apikey", "key", "token", "accesstoken", "refreshtoken", "idtoken", "authtoken",
    "sessiontoken", "secret", "clientsecret", "password", "passwd", "pwd", "pass",
    "auth", "authorization", "credential", "credentials", "signature", "sig", "xapikey",
    "xamzsecuritytoken", "xamzsignature", "xamzcredential", "jwt", "bearer",
})

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
# A run of path: from a slash to the first character a request target's path cannot hold.
_PATH_RUN = re.compile(r"/[^\s?#'\"<>]*")
_PATH_SAFE = "/:@!$&'()*+,;=-._~"  # RFC 3986 pchar and "/": kept as is when re-encoding
_PAIR = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#\s'\"<>]+)=(?P<value>[^&;#\s'\"<>]*)")


def is_secret_name(name: str) -> bool:
    return unquote(name).lower().replace("-", "").replace("_", "") in SECRET_NAMES


def _mask_pairs(text: str) -> str:
    def mask(match: re.Match[str]) -> str:
        if not is_secret_name(match["name"]) or not match["value"]:
            return match[0]
        return f"{match['lead']}{match['name']}={MASK}"

    return _PAIR.sub(mask, text)


def redact_url(url: str) -> str:
    """The URL with userinfo and secret query/fragment values replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if sep:
        # The authority ends at the first / ? or #; userinfo is what precedes its last @.
        end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
                  default=len(rest))
        authority, tail = rest[:end], rest[end:]
        if "@" in authority:
            authority = MASK + "@" + authority.rpartition("@")[2]
        url = f"{scheme}{sep}{authority}{tail}"
    return _mask_pairs(url)


def redact_text(text: str, secret_path_prefixes: Iterable[str] = ()) -> str:
    """Every URL and query-like pair in free text redacted; also `PREFIX/<secret>`."""
    text = _URL.sub(lambda m: redact_url(m[0]), text)
    text = _mask_pairs(text)
    prefixes = tuple(prefix.rstrip("/") + "/" for prefix in secret_path_prefixes
                     if prefix.strip("/"))
    if prefixes:
        text = _PATH_RUN.sub(lambda m: _mask_path_run(m[0], prefixes), text)
    return text


def _mask_path_run(run: str, prefixes: tuple[str, ...]) -> str:
    """The segment after a secret-bearing prefix masked, judged on the decoded path (what
    the router matches); a run that holds none is kept verbatim."""
    decoded = unquote(run, errors="replace")
    for prefix in prefixes:
        at = decoded.find(prefix)
        if at < 0:
            continue
        start = at + len(prefix)
        end = decoded.find("/", start)
        end = len(decoded) if end < 0 else end
        if end == start:
            continue  # nothing after the prefix to hide
        masked = decoded[:start] + MASK + decoded[end:]
        return quote(masked, safe=_PATH_SAFE)  # re-encoded: decoding let no control through
    return run


class RedactingFilter(logging.Filter):
    """Attach to a handler: every record it writes is passed through redact_text, and its
    control characters are escaped (log_safe.printable), whatever logged it."""

    def __init__(self, secret_path_prefixes: Iterable[str] = ()) -> None:
        super().__init__()
        self.prefixes = tuple(secret_path_prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = printable(redact_text(message, self.prefixes), limit=None,
                             backslashes=False)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
