"""SIP messages: parse bytes into requests and responses, and write them back (RFC 3261 §7).

The parser takes whatever arrives on the SIP port, from anyone, and must survive it: the
RFC 4475 torture messages, compact header names, folded lines, escaped URIs, unknown
schemes, wrong Content-Lengths, missing mandatory headers and oversized messages. It
returns either a message whose mandatory headers (Via, From, To, Call-ID, CSeq) have been
checked, or a `ParseFailure` saying why, with a SIP status to answer (400, 413, 416, 505)
and what of the request could be read so the answer can be addressed. Nothing raises: a
bug in the parser itself becomes a failure with code `internal_parse_error`.

Why our own: no SIP library on PyPI is fit for the agent (docs/sip.md), and a user agent
needs only this much of the grammar.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from signaling.sip.uri import (
    NameAddr,
    Params,
    Uri,
    format_params,
    is_token,
    parse_header_params,
    parse_name_addr,
    parse_uri,
    split_outside_quotes,
)

log = logging.getLogger(__name__)

SIP_VERSION = "SIP/2.0"
# Larger messages are refused: 413 where a request's head could be read, else dropped.
MAX_MESSAGE_BYTES = 64 * 1024
MAX_HEADER_LINES = 256
MAX_CSEQ = 2**31 - 1

COMPACT_FORMS = {
    "a": "accept-contact", "b": "referred-by", "c": "content-type", "d": "request-disposition",
    "e": "content-encoding", "f": "from", "i": "call-id", "j": "reject-contact", "k": "supported",
    "l": "content-length", "m": "contact", "n": "identity-info", "o": "event", "r": "refer-to",
    "s": "subject", "t": "to", "u": "allow-events", "v": "via", "x": "session-expires",
    "y": "identity",
}
CANONICAL_NAMES = {
    "call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate",
    "mime-version": "MIME-Version", "rack": "RAck", "rseq": "RSeq",
}
# Headers whose values may be comma-separated lists (RFC 3261 §7.3.1).
LIST_HEADERS = frozenset({
    "via", "route", "record-route", "contact", "allow", "supported", "require",
    "proxy-require", "unsupported", "accept", "accept-encoding", "accept-language",
    "allow-events", "content-encoding", "content-language", "in-reply-to", "warning",
    "alert-info", "call-info", "error-info",
})
SINGLE_HEADERS = frozenset({"call-id", "cseq", "from", "to", "max-forwards", "content-type"})
REQUIRED = ("via", "from", "to", "call-id", "cseq")
KNOWN_HEADERS = frozenset(COMPACT_FORMS.values()) | {
    "content-length", "max-forwards", "retry-after", "server", "user-agent", "timestamp",
    "reason", "expires", "date", "min-expires", "authorization", "www-authenticate",
    "proxy-authenticate", "proxy-authorization", "mime-version", "organization", "priority",
}

_METHOD = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+\Z")
_STATUS_LINE = re.compile(r"SIP/(\d+)\.(\d+) (\d{3}) ([^\r\n]*)\Z")
_VIA = re.compile(r"\s*([A-Za-z0-9\-.!%*_+`'~]+)\s*/\s*([A-Za-z0-9\-.!%*_+`'~]+)\s*/\s*"
                  r"([A-Za-z0-9\-.!%*_+`'~]+)\s+(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-.]+)"
                  r"(?:\s*:\s*(\d{1,5}))?\s*(;.*)?\Z", re.DOTALL)


def canonical_name(name: str) -> str:
    """The long form of a header name, lower-case (compact forms expanded)."""
    lowered = name.lower()
    return COMPACT_FORMS.get(lowered, lowered)


def display_name(key: str) -> str:
    return CANONICAL_NAMES.get(key) or "-".join(part.capitalize() for part in key.split("-"))


def _written_name(name: str, key: str) -> str:
    """How a header is written out: known ones in their usual spelling (compact forms
    expanded), unknown ones as they came."""
    if key in LIST_HEADERS or key in SINGLE_HEADERS or key in KNOWN_HEADERS or len(name) == 1:
        return display_name(key)
    return name


class Headers:
    """Header fields in order, looked up case-insensitively by long or compact name."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        # (canonical lower-case name, the name as written out, value)
        self._items: list[tuple[str, str, str]] = []
        for name, value in items:
            self.add(name, value)

    @staticmethod
    def _item(name: str, value: str) -> tuple[str, str, str]:
        key = canonical_name(name)
        return key, _written_name(name, key), value

    def add(self, name: str, value: str) -> None:
        self._items.append(self._item(name, value))

    def set(self, name: str, value: str) -> None:
        """Replace every field of this name by one, where the first one was."""
        self.replace_values(name, [value])

    def replace_values(self, name: str, values: list[str]) -> None:
        """Every field of this name replaced by one line per value, where the first was."""
        key = canonical_name(name)
        index = next((i for i, item in enumerate(self._items) if item[0] == key),
                     len(self._items))
        kept = [item for item in self._items if item[0] != key]
        before = sum(1 for item in self._items[:index] if item[0] != key)
        self._items = (kept[:before] + [self._item(name, value) for value in values]
                       + kept[before:])

    def remove(self, name: str) -> None:
        key = canonical_name(name)
        self._items = [item for item in self._items if item[0] != key]

    def get(self, name: str) -> str | None:
        """The first field's value (a whole line, not split at commas)."""
        key = canonical_name(name)
        for existing, _, value in self._items:
            if existing == key:
                return value
        return None

    def lines(self, name: str) -> list[str]:
        """Every field line of this name, unsplit."""
        key = canonical_name(name)
        return [value for existing, _, value in self._items if existing == key]

    def get_all(self, name: str) -> list[str]:
        """Every value of this name; for list headers, comma-separated values split apart.
        A value whose quotes or brackets never close is kept whole (callers reject it)."""
        values: list[str] = []
        list_header = canonical_name(name) in LIST_HEADERS
        for line in self.lines(name):
            parts = split_outside_quotes(line, ",") if list_header else None
            if parts is None:
                values.append(line.strip())
            else:
                values.extend(part.strip() for part in parts if part.strip())
        return values

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """(display name, value) in order."""
        return ((written, value) for _, written, value in self._items)

    def copy(self) -> Headers:
        copied = Headers()
        copied._items = list(self._items)
        return copied


# -- structured header values ------------------------------------------------------------------


@dataclass(frozen=True)
class Via:
    protocol: str  # "SIP/2.0"
    transport: str  # upper-case: UDP, TCP, TLS, SCTP, WS, ...
    host: str  # lower-case; IPv6 without brackets
    port: int | None
    params: Params = ()

    @property
    def branch(self) -> str | None:
        return self.param("branch")

    def param(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.params:
            if key.lower() == lowered:
                return "" if value is None else value
        return None

    @property
    def sent_by(self) -> tuple[str, int]:
        return self.host, self.port or (5061 if self.transport == "TLS" else 5060)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.protocol}/{self.transport} {host}{port}{format_params(self.params)}"


def parse_via(text: str) -> Via | None:
    match = _VIA.match(text)
    if match is None:
        return None
    name, version, transport, host, port_text, param_text = match.groups()
    if name.upper() != "SIP" or version != "2.0":
        return None
    params = parse_header_params(param_text or "")
    port = int(port_text) if port_text else None
    if params is None or (port is not None and not 0 < port <= 65535):
        return None
    host = host[1:-1] if host.startswith("[") else host
    return Via("SIP/2.0", transport.upper(), host.lower(), port, params)


@dataclass(frozen=True)
class CSeq:
    number: int
    method: str

    def __str__(self) -> str:
        return f"{self.number} {self.method}"


def parse_cseq(text: str) -> CSeq | None:
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or not _METHOD.match(parts[1]):
        return None
    number = int(parts[0]) if len(parts[0]) <= 12 else MAX_CSEQ + 1
    if number > MAX_CSEQ:
        return None
    return CSeq(number, parts[1])


# -- messages ----------------------------------------------------------------------------------


@dataclass
class SipMessage:
    headers: Headers
    body: bytes = b""

    @property
    def call_id(self) -> str:
        return (self.headers.get("call-id") or "").strip()

    @property
    def cseq(self) -> CSeq:
        cseq = parse_cseq(self.headers.get("cseq") or "")
        return cseq if cseq is not None else CSeq(0, "")

    @property
    def from_addr(self) -> NameAddr:
        return _name_addr(self.headers.get("from"))

    @property
    def to_addr(self) -> NameAddr:
        return _name_addr(self.headers.get("to"))

    @property
    def vias(self) -> list[Via]:
        return [via for via in map(parse_via, self.headers.get_all("via")) if via is not None]

    @property
    def top_via(self) -> Via | None:
        values = self.headers.get_all("via")
        return parse_via(values[0]) if values else None

    @property
    def content_type(self) -> str:
        value = self.headers.get("content-type") or ""
        return value.split(";", 1)[0].strip().lower()

    def to_bytes(self) -> bytes:
        lines = [self.start_line()]
        lines.extend(f"{name}: {value}" for name, value in self.headers
                     if name.lower() != "content-length")
        lines.append(f"Content-Length: {len(self.body)}")
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8") + self.body

    def start_line(self) -> str:
        raise NotImplementedError


_NO_ADDRESS = NameAddr(uri=Uri(scheme="sip", host="invalid"))  # never seen once validated


def _name_addr(value: str | None) -> NameAddr:
    parsed = parse_name_addr(value) if value is not None else None
    return parsed if parsed is not None else _NO_ADDRESS


@dataclass
class SipRequest(SipMessage):
    method: str = ""
    uri: str = ""  # the Request-URI as written

    def start_line(self) -> str:
        return f"{self.method} {self.uri} {SIP_VERSION}"

    def __repr__(self) -> str:
        return f"<SipRequest {self.method} {self.uri} call-id={self.call_id!r}>"


@dataclass
class SipResponse(SipMessage):
    status: int = 0
    reason: str = ""

    def start_line(self) -> str:
        return f"{SIP_VERSION} {self.status} {self.reason}"

    def __repr__(self) -> str:
        return f"<SipResponse {self.status} {self.reason} call-id={self.call_id!r}>"


@dataclass(frozen=True)
class ParseFailure:
    """Why bytes were not a usable message: a code for logs and tests, and what to answer."""

    code: str
    message: str
    status: int | None = None  # the SIP status to answer a request with; None: drop it
    partial: SipRequest | None = field(default=None, compare=False)  # what could be read


ParseResult = SipRequest | SipResponse | ParseFailure

REASONS = {
    100: "Trying", 180: "Ringing", 181: "Call Is Being Forwarded", 183: "Session Progress",
    200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Request Entity Too Large",
    415: "Unsupported Media Type", 416: "Unsupported URI Scheme", 420: "Bad Extension",
    480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist",
    482: "Loop Detected", 486: "Busy Here", 487: "Request Terminated",
    488: "Not Acceptable Here", 491: "Request Pending", 500: "Server Internal Error",
    501: "Not Implemented", 503: "Service Unavailable", 504: "Server Time-out",
    505: "Version Not Supported", 513: "Message Too Large", 603: "Decline",
}


# -- parsing -----------------------------------------------------------------------------------


def parse_message(data: bytes, *, stream: bool = False,
                  max_bytes: int = MAX_MESSAGE_BYTES) -> ParseResult:
    """One message from a datagram (or from a frame cut by `frame_stream`). Never raises."""
    try:
        return _parse(data, stream, max_bytes)
    except Exception as exc:  # a parser bug must not take the server down
        log.exception("SIP parser failed on a %d-byte message", len(data))
        return ParseFailure("internal_parse_error", f"parser error: {type(exc).__name__}")


def _split_head(data: bytes) -> tuple[bytes, bytes] | None:
    for separator in (b"\r\n\r\n", b"\n\n"):
        index = data.find(separator)
        if index >= 0:
            return data[:index], data[index + len(separator):]
    return None


def _unfold(head: str) -> list[str] | None:
    """Header lines with continuation lines (starting with SP/HT) joined; None when the
    first header line is a continuation."""
    lines: list[str] = []
    for line in re.split(r"\r?\n", head):
        if line[:1] in (" ", "\t"):
            if not lines:
                return None
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _parse(data: bytes, stream: bool, max_bytes: int) -> ParseResult:
    data = data.lstrip(b"\r\n")  # keep-alive CRLFs before a message are allowed
    if not data:
        return ParseFailure("empty", "no message")
    if len(data) > max_bytes:
        head_end = data.find(b"\r\n\r\n")
        partial = _partial_request(data[:head_end] if 0 <= head_end <= max_bytes else b"")
        return ParseFailure("message_too_large",
                            f"messages are limited to {max_bytes} bytes", 413, partial)
    parts = _split_head(data)
    if parts is None:
        return ParseFailure("no_end_of_headers", "the header section never ends",
                            400, _partial_request(data))
    head_bytes, body = parts
    head = head_bytes.decode("utf-8", "replace")
    lines = _unfold(head)
    if lines is None or not lines:
        return ParseFailure("bad_folding", "a continuation line before any header")
    start, header_lines = lines[0], lines[1:]
    if len(header_lines) > MAX_HEADER_LINES:
        return ParseFailure("too_many_headers", f"more than {MAX_HEADER_LINES} header lines",
                            400, None)
    headers = Headers()
    bad_header: str | None = None
    for line in header_lines:
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not is_token(name):
            bad_header = bad_header or f"malformed header line {line[:40]!r}"
            continue
        headers.add(name, value.strip())
    if start.startswith("SIP/"):
        return _finish_response(start, headers, body, stream, bad_header)
    return _finish_request(start, headers, body, stream, bad_header)


def _partial_request(head: bytes) -> SipRequest | None:
    """Whatever a broken request's head lets us read: enough, perhaps, to address a 4xx."""
    lines = _unfold(head.decode("utf-8", "replace")) or []
    if not lines or lines[0].startswith("SIP/"):
        return None
    method = lines[0].split(" ", 1)[0]
    headers = Headers()
    for line in lines[1:MAX_HEADER_LINES]:
        name, colon, value = line.partition(":")
        if colon and is_token(name.strip()):
            headers.add(name.strip(), value.strip())
    return SipRequest(headers=headers, method=method if _METHOD.match(method) else "")


def _content_length(headers: Headers) -> tuple[int | None, str | None]:
    """(length or None when absent, a complaint when invalid)."""
    values = {value.strip() for value in headers.lines("content-length")}
    if not values:
        return None, None
    if len(values) > 1:
        return None, "conflicting Content-Length values"
    text = values.pop()
    if not text.isdigit() or len(text) > 9:
        return None, f"invalid Content-Length {text[:20]!r}"
    return int(text), None


def _body(headers: Headers, body: bytes, stream: bool) -> tuple[bytes, str | None]:
    length, problem = _content_length(headers)
    if problem is not None:
        return body, problem
    if length is None:
        return (b"" if stream else body), None
    if length > len(body):
        return body, f"Content-Length {length} is more than the {len(body)} bytes sent"
    return body[:length], None  # extra bytes after the body (a second message) are ignored


def _finish_request(start: str, headers: Headers, body: bytes, stream: bool,
                    bad_header: str | None) -> ParseResult:
    partial = SipRequest(headers=headers, body=b"", method="", uri="")
    pieces = start.split(" ")
    if len(pieces) != 3 or not all(pieces):
        # RFC 4475 lwsruri/lwsstart/trws: extra or missing spaces in the request line.
        method = pieces[0] if pieces and _METHOD.match(pieces[0]) else ""
        partial.method = method
        return ParseFailure("bad_request_line", f"malformed request line {start[:60]!r}",
                            400 if method else None, partial if method else None)
    method, uri_text, version = pieces
    if not _METHOD.match(method):
        return ParseFailure("bad_method", f"invalid method {method[:20]!r}")
    partial.method, partial.uri = method, uri_text
    if version.upper() != SIP_VERSION:
        if re.fullmatch(r"SIP/\d+\.\d+", version, re.IGNORECASE):
            return ParseFailure("version_not_supported", f"{version} is not SIP/2.0", 505,
                                partial)
        return ParseFailure("bad_request_line", f"invalid version {version[:20]!r}", 400,
                            partial)
    uri = parse_uri(uri_text)
    if uri is None:
        return ParseFailure("bad_request_uri", f"invalid Request-URI {uri_text[:60]!r}", 400,
                            partial)
    if not uri.is_sip and uri.scheme != "tel":
        return ParseFailure("unsupported_uri_scheme", f"{uri.scheme}: URIs are not served",
                            416, partial)
    problem = bad_header or _check_required(headers)
    if problem is None:
        cseq = parse_cseq(headers.get("cseq") or "")
        if cseq is None:
            problem = "invalid CSeq"
        elif cseq.method != method:
            problem = f"CSeq method {cseq.method[:20]!r} is not the request's"
    if problem is None:
        max_forwards = headers.get("max-forwards")
        if max_forwards is not None and (not max_forwards.isdigit() or len(max_forwards) > 10
                                         or int(max_forwards) > 255):
            problem = "invalid Max-Forwards"
    content, body_problem = _body(headers, body, stream)
    problem = problem or body_problem
    if problem is not None:
        return ParseFailure("bad_request", problem, 400, partial)
    return SipRequest(headers=headers, body=content, method=method, uri=uri_text)


def _finish_response(start: str, headers: Headers, body: bytes, stream: bool,
                     bad_header: str | None) -> ParseResult:
    match = _STATUS_LINE.match(start)
    if match is None:
        # "SIP/2.0 200" without the space before an empty reason: accepted as RFC 4475
        # noreason allows, anything else is dropped.
        bare = re.fullmatch(r"SIP/2\.0 (\d{3})", start)
        if bare is None:
            return ParseFailure("bad_status_line", f"malformed status line {start[:60]!r}")
        major, minor, code, reason = "2", "0", bare.group(1), ""
    else:
        major, minor, code, reason = match.groups()
    if (major, minor) != ("2", "0"):
        return ParseFailure("version_not_supported", "response is not SIP/2.0")
    status = int(code)
    if not 100 <= status <= 699:
        return ParseFailure("bad_status", f"status {status} out of range")
    problem = bad_header or _check_required(headers)
    content, body_problem = _body(headers, body, stream)
    problem = problem or body_problem
    if problem is None and parse_cseq(headers.get("cseq") or "") is None:
        problem = "invalid CSeq"
    if problem is not None:
        return ParseFailure("bad_response", problem)
    return SipResponse(headers=headers, body=content, status=status, reason=reason)


def _check_required(headers: Headers) -> str | None:
    for name in REQUIRED:
        if name not in headers:
            return f"missing {display_name(name)} header"
    for name in SINGLE_HEADERS:
        if len(headers.lines(name)) > 1:
            return f"more than one {display_name(name)} header"
    vias = headers.get_all("via")
    if not vias or any(parse_via(via) is None for via in vias):
        return "invalid Via header"
    for name in ("from", "to"):
        if parse_name_addr(headers.get(name) or "") is None:
            return f"invalid {display_name(name)} header"
    if not (headers.get("call-id") or "").strip():
        return "empty Call-ID"
    return None


# -- stream framing (TCP) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One message cut from a stream buffer: its bytes and how much of the buffer it used."""

    data: bytes
    consumed: int


def frame_stream(buffer: bytes | bytearray,
                 max_bytes: int = MAX_MESSAGE_BYTES) -> Frame | ParseFailure | None:
    """Cut the first message from a TCP buffer: a Frame, None when more bytes are needed,
    or a failure after which the connection cannot be trusted (it is then closed). A
    keep-alive (CRLF pairs, RFC 5626) comes back as a Frame of empty data."""
    start = 0
    while buffer[start: start + 2] == b"\r\n":
        start += 2
    if start:
        return Frame(b"", start)
    end = bytes(buffer[: max_bytes + 4]).find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > max_bytes:
            return ParseFailure("message_too_large", "header section over the size limit", 413,
                                _partial_request(bytes(buffer[:max_bytes])))
        return None
    head = bytes(buffer[:end])
    length = 0
    for line in re.split(r"\r?\n", head.decode("utf-8", "replace"))[1:]:
        name, colon, value = line.partition(":")
        if colon and canonical_name(name.strip()) == "content-length":
            text = value.strip()
            if not text.isdigit() or len(text) > 9:
                return ParseFailure("bad_content_length", "invalid Content-Length on a stream",
                                    400, _partial_request(head))
            length = int(text)
    total = end + 4 + length
    if total > max_bytes:
        return ParseFailure("message_too_large", f"messages are limited to {max_bytes} bytes",
                            413, _partial_request(head))
    if len(buffer) < total:
        return None
    return Frame(bytes(buffer[:total]), total)
