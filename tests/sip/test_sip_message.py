"""The SIP parser against torture messages in the spirit of RFC 4475 (written for this suite,
one per kind of abuse the RFC lists), then against random bytes and random damage to valid
messages: every valid one is read, every invalid one refused with the right status, and the
parser itself never fails."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signaling.sip.message import (
    MAX_MESSAGE_BYTES,
    Frame,
    Headers,
    ParseFailure,
    SipRequest,
    SipResponse,
    frame_stream,
    parse_message,
)
from signaling.sip.uri import parse_name_addr, parse_uri, unescape


def wire(text: str) -> bytes:
    """Test messages are written with \\n; the wire has CRLF (a body keeps what it says)."""
    head, sep, body = text.partition("\n\n")
    return (head.replace("\n", "\r\n") + ("\r\n\r\n" if sep else "")).encode() + body.encode()


SDP = "v=0\no=a 1 1 IN IP4 192.0.2.9\ns=-\nc=IN IP4 192.0.2.9\nt=0 0\nm=audio 4000 RTP/AVP 0\n"

VALID: dict[str, str] = {
    # Folding everywhere, LWS around colons/semicolons/slashes, odd case, a long and a short
    # name for the same header, unknown headers (one whose value is not generic-param
    # syntax), an escaped quote in a display name, an empty Subject, leading zeros.
    "folded_and_spaced": (
        "INVITE sip:bob@pbx.example.org;oddparam SIP/2.0\n"
        "tO  :\n  sip:bob@pbx.example.org ;  tag   =  77abc\n"
        'FROM:   "Ann \\"the caller\\""    <sip:ann@example.com>\n   ;\n   tag = f00d\n'
        "max-FORWARDS: 0042\n"
        "call-id: fold.1234@192.0.2.5\n"
        f"Content-Length   : {len(SDP)}\n"
        "cSeQ: 0017\n   INVITE\n"
        "Via  : SIP  /  2.0\n  /UDP\n     192.0.2.5;rport;branch=z9hG4bKfold1\n"
        "s  :\n"
        "X-Made-Up:   first part\n  second part\n"
        "X-Unusual: ;;,,;;,;\n"
        "c: application/sdp\n"
        "v:  SIP / 2.0 / TCP   relay.example.net  ;\n   branch = z9hG4bKrelay , \n"
        "  SIP /2.0/ UDP 192.0.2.77 ; branch=\n z9hG4bKlast\n"
        'm: "Ann" <sip:ann@192.0.2.5> ;  foo = \n  bar ; flag ; q = 0.5\n\n'
        + SDP
    ),
    # Every character a token may hold, in a method, a URI user and a branch.
    "unusual_characters": (
        "~odd-Method_0123.!%*+`'  sip:1_odd.user~(ok)&it's+fine$/?,/;;*:pw!*~@example.com "
        "SIP/2.0\n".replace("  ", " ")
        + "Via: SIP/2.0/UDP host1.example.com;rport;branch=z9hG4bK-.!%66*_+`'~\n"
        "To: \"BEL:\\\x07 DEL:\\\x7f\" <sip:1_odd.user~(ok)&it's+fine$/?,/;;*@example.com>\n"
        "From: tok1~` tok2'+_ tok3*%!.- <sip:plain@example.com> ;fromParam''~+*_!.-%=\"q\""
        ";tag=_t~1'+`*%!-.\n"
        "Call-ID: odd.chars.()<>@[]:\"/?{}=\n"
        "CSeq: 139122385 ~odd-Method_0123.!%*+`'\n"
        "Max-Forwards: 255\n"
        "extensionHeader-!.%*+_`'~: \u00ef\u00bb\u00bf\u5927\u5ec8\n"
        "Content-Length: 0\n\n"
    ),
    # %-escapes in the Request-URI, To, From and Contact (URI parameters included).
    "escapes": (
        "INVITE sip:sips%3Aann%40example.com@example.net SIP/2.0\n"
        "To: sip:%61nn@example.com\n"
        "From: <sip:I%20am%20spaced@example.net>;tag=esc1\n"
        "Max-Forwards: 87\n"
        "i: escapes.1@192.0.2.1\n"
        "CSeq: 234 INVITE\n"
        "Via: SIP/2.0/UDP host5.example.net;rport;branch=z9hG4bKesc\n"
        "C: application/sdp\n"
        "Contact:\n  <sip:c%61ller@192.0.2.1:5060;%6C%72;n%61me=v%61lue%25%34%31>\n"
        f"Content-Length: {len(SDP)}\n\n" + SDP
    ),
    "escaped_null": (
        "REGISTER sip:example.com SIP/2.0\n"
        "To: sip:null-%00-null@example.com\n"
        "From: sip:null-%00-null@example.com;tag=n1\n"
        "Call-ID: escaped-null-1@192.0.2.2\nCSeq: 1 REGISTER\nMax-Forwards: 70\n"
        "Via: SIP/2.0/UDP 192.0.2.2;branch=z9hG4bKnull\n"
        "Contact: <sip:%00@192.0.2.2>\nl: 0\n\n"
    ),
    "no_space_before_bracket": (
        "OPTIONS sip:user@example.com SIP/2.0\n"
        "To: sip:user@example.com\n"
        "From: caller<sip:caller@example.com>;tag=323\n"
        "Max-Forwards: 70\nCall-ID: no-space-1@192.0.2.3\nCSeq: 60 OPTIONS\n"
        "Via: SIP/2.0/UDP 192.0.2.3;branch=z9hG4bKdisp\nl: 0\n\n"
    ),
    "long_values": (
        "INVITE sip:user@example.com SIP/2.0\n"
        'To: "' + "I" * 3000 + '" <sip:user@example.com>;tag=' + "t" * 500 + "\n"
        "From: sip:caller@example.net;tag=" + "f" * 2000 + "\n"
        "Call-ID: " + "c" * 4000 + "\n"
        "CSeq: 1 INVITE\nMax-Forwards: 70\n"
        + "".join(f"Via: SIP/2.0/TCP sip{i}.example.com;branch=z9hG4bK{i:04d}\n"
                  for i in range(40))
        + "Contact: <sip:user@host.example.com;" + "p" * 3000 + "=v>\n"
        "Content-Length: 0\n\n"
    ),
    # Two requests in one datagram: the first is read, the rest ignored.
    "two_in_one": (
        "REGISTER sip:example.com SIP/2.0\n"
        "To: sip:jo.user@example.com\nFrom: sip:jo.user@example.com;tag=r1\n"
        "Max-Forwards: 8\nI: first-of-two\nCSeq: 8 REGISTER\n"
        "Via: SIP/2.0/UDP 192.0.2.125;branch=z9hG4bKdbl\nContact: <sip:jo.user@host.example.com>\n"
        "l: 0\n\n"
        "INVITE sip:joe@example.com SIP/2.0\nt: sip:joe@example.com\n"
        "From: sip:caller@example.net;tag=t2\nMax-Forwards: 8\nCall-ID: second@192.0.2.15\n"
        "CSeq: 8 INVITE\nVia: SIP/2.0/UDP 192.0.2.15;branch=z9hG4bK2nd\nl: 0\n\n"
    ),
    "semicolon_in_user": (
        "OPTIONS sip:user;par=u%40example.net@example.com SIP/2.0\n"
        "To: sip:j_user@example.com\nFrom: sip:caller@example.org;tag=c9\n"
        "Max-Forwards: 3\nCall-ID: semicolon-user-1\nCSeq: 8 OPTIONS\n"
        "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKkdjuw\nl: 0\n\n"
    ),
    "unknown_transports": (
        "OPTIONS sip:user@example.com SIP/2.0\n"
        "To: sip:user@example.com\nFrom: <sip:caller@example.com>;tag=323\n"
        "Max-Forwards: 70\nCall-ID: transports.7d1e\nAccept: application/sdp\n"
        "CSeq: 60 OPTIONS\n"
        "Via: SIP/2.0/UDP t1.example.com;branch=z9hG4bKkdjuw\n"
        "Via: SIP/2.0/SCTP t2.example.com;branch=z9hG4bKsctp\n"
        "Via: SIP/2.0/TLS t3.example.com;branch=z9hG4bKtls\n"
        "Via: SIP/2.0/UNKNOWN t4.example.com;branch=z9hG4bKunk\n"
        "Via: SIP/2.0/TCP t5.example.com;branch=z9hG4bKtcp\nl: 0\n\n"
    ),
    "multipart_body": (
        "MESSAGE sip:kim@example.org SIP/2.0\n"
        "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKmp\nMax-Forwards: 70\n"
        "From: sip:ann@example.com;tag=mp1\nTo: sip:kim@example.org\nCall-ID: mp@192.0.2.1\n"
        "CSeq: 1 MESSAGE\nContent-Type: multipart/mixed;boundary=\"B\"\nContent-Length: 44\n\n"
        "--B\r\nContent-Type: text/plain\r\n\r\nhello\r\n--B--\r\n"
    ),
    "response_with_odd_reason": (
        "SIP/2.0 200 = 2**3 * 5**2 \u043d\u043e \u0441\u0442\u043e\n"
        "Via: SIP/2.0/UDP 192.0.2.198;branch=z9hG4bKodd1\n"
        "Call-ID: odd-reason-1\nCSeq: 35 INVITE\n"
        "From: sip:user@example.com;tag=a5\nTo: sip:user@example.edu;tag=b6\n"
        "Content-Length: 0\n\n"
    ),
    "response_without_reason": (
        "SIP/2.0 100 \nVia: SIP/2.0/UDP 192.0.2.105;branch=z9hG4bKnr1\n"
        "Call-ID: no-reason-1\nCSeq: 35 INVITE\n"
        "From: <sip:user@example.com>;tag=a7\nTo: <sip:user@example.edu>;tag=b8\n"
        "Content-Length: 0\n\n"
    ),
    "ipv6_everywhere": (
        "INVITE sip:user@[2001:db8::10]:5070 SIP/2.0\n"
        "To: sip:user@[2001:db8::10]\nFrom: sip:user@example.com;tag=v6t\n"
        "Via: SIP/2.0/UDP [2001:db8::9:1];branch=z9hG4bKv6\n"
        "Call-ID: v6-call-1@example.com\nMax-Forwards: 70\n"
        "Contact: \"Caller\" <sip:caller@[2001:db8::9:1]:5060>\nCSeq: 8612 INVITE\nl: 0\n\n"
    ),
    "unknown_scheme_in_to": (
        "OPTIONS sip:user@example.org SIP/2.0\n"
        "Via: SIP/2.0/UDP host4.example.com:5060;branch=z9hG4bKns1\n"
        "Max-Forwards: 70\nFrom: <sip:caller@example.net>;tag=384\nTo: isbn:9780000000002\n"
        "Call-ID: novel-scheme-1\nCSeq: 42 OPTIONS\nl: 0\n\n"
    ),
    "tel_request_uri": (
        "INVITE tel:+15555550100 SIP/2.0\nVia: SIP/2.0/UDP 192.0.2.4;branch=z9hG4bKtel\n"
        "From: <sip:a@example.com>;tag=1\nTo: <tel:+15555550100>\nCall-ID: tel-1\n"
        "CSeq: 1 INVITE\nContent-Length: 0\n\n"
    ),
    "bare_lf_line_ends": "OPTIONS sip:a@example.com SIP/2.0\n",  # filled in below
    "magic_cookie_only_branch": (
        "OPTIONS sip:user@example.com SIP/2.0\nTo: sip:user@example.com\n"
        "From: sip:caller@example.org;tag=c9\nMax-Forwards: 3\n"
        "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK\nCall-ID: cookie-only-branch-1\n"
        "CSeq: 8 OPTIONS\nl: 0\n\n"
    ),
}

BASE_HEADERS = (
    "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKbase\nFrom: <sip:a@example.com>;tag=1\n"
    "To: <sip:b@example.com>\nCall-ID: base@192.0.2.1\nMax-Forwards: 70\n"
)

INVALID: dict[str, tuple[str, str, int | None]] = {
    # name: (message, failure code, status to answer; None: dropped)
    "content_length_too_large": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS
        + "CSeq: 1 OPTIONS\nContent-Length: 9999\n\nshort body", "bad_request", 400),
    "negative_content_length": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS
        + "CSeq: 1 OPTIONS\nContent-Length: -5\n\n", "bad_request", 400),
    "conflicting_content_lengths": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS
        + "CSeq: 1 OPTIONS\nContent-Length: 0\nl: 4\n\nabcd", "bad_request", 400),
    "cseq_out_of_range": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS
        + "CSeq: 99999999999999999999 OPTIONS\nl: 0\n\n", "bad_request", 400),
    "max_forwards_out_of_range": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS.replace("70", "300")
        + "CSeq: 1 OPTIONS\nl: 0\n\n", "bad_request", 400),
    "unbalanced_quotes": (
        ("OPTIONS sip:b@example.com SIP/2.0\n"
         "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKq\nFrom: <sip:a@example.com>;tag=1\n"
         'To: "Mr. J. User <sip:jo.user@example.com>\nCall-ID: quotbal\nCSeq: 1 OPTIONS\n'
         "l: 0\n\n"),
        "bad_request", 400),
    "request_uri_in_brackets": (
        "INVITE <sip:user@example.com> SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 INVITE\nl: 0\n\n",
        "bad_request_uri", 400),
    "spaces_in_request_uri": (
        "INVITE sip:user@example.com; lr SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 INVITE\nl: 0\n\n",
        "bad_request_line", 400),
    "extra_spaces_in_request_line": (
        "INVITE  sip:user@example.com  SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 INVITE\nl: 0\n\n",
        "bad_request_line", 400),
    "trailing_space_in_request_line": (
        "OPTIONS sip:user@example.com SIP/2.0 \n" + BASE_HEADERS + "CSeq: 1 OPTIONS\nl: 0\n\n",
        "bad_request_line", 400),
    "space_inside_brackets": (
        ("OPTIONS sip:user@example.org SIP/2.0\n"
         "Via: SIP/2.0/UDP host4.example.com:5060;branch=z9hG4bKsp1\n"
         'From: "Doe, Jane" <sip:jane@example.com>;tag=41\n'
         'To: "Roe, Richard" < sip:richard@example.org >\nCall-ID: spaced-brackets\n'
         "CSeq: 7 OPTIONS\nl: 0\n\n"), "bad_request", 400),
    "missing_call_id_from_to": (
        ("OPTIONS sip:user@example.com SIP/2.0\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKi\n"
         "CSeq: 1 OPTIONS\nl: 0\n\n"), "bad_request", 400),
    "missing_via": (
        ("OPTIONS sip:user@example.com SIP/2.0\nFrom: <sip:a@example.com>;tag=1\n"
         "To: <sip:b@example.com>\nCall-ID: novia\nCSeq: 1 OPTIONS\nl: 0\n\n"),
        "bad_request", 400),
    "cseq_method_mismatch": (
        "OPTIONS sip:user@example.com SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 INVITE\nl: 0\n\n",
        "bad_request", 400),
    "unknown_method_cseq_mismatch": (
        "NEWMETHOD sip:user@example.com SIP/2.0\n" + BASE_HEADERS
        + "CSeq: 3 INVITE\nl: 0\n\n", "bad_request", 400),
    "two_call_ids": (
        "OPTIONS sip:user@example.com SIP/2.0\n" + BASE_HEADERS
        + "Call-ID: second\nCSeq: 1 OPTIONS\nl: 0\n\n", "bad_request", 400),
    "two_to_headers": (
        "OPTIONS sip:user@example.com SIP/2.0\n" + BASE_HEADERS
        + "t: <sip:c@example.com>\nCSeq: 1 OPTIONS\nl: 0\n\n", "bad_request", 400),
    "version_7": (
        "OPTIONS sip:t.watson@example.org SIP/7.0\n" + BASE_HEADERS
        + "CSeq: 1 OPTIONS\nl: 0\n\n", "version_not_supported", 505),
    "unknown_request_uri_scheme": (
        "OPTIONS nobodyknows:zz9 SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 OPTIONS\nl: 0\n\n",
        "unsupported_uri_scheme", 416),
    "header_without_colon": (
        "OPTIONS sip:b@example.com SIP/2.0\n" + BASE_HEADERS
        + "NotAHeaderLine\nCSeq: 1 OPTIONS\nl: 0\n\n", "bad_request", 400),
    "invalid_via": (
        ("OPTIONS sip:b@example.com SIP/2.0\nVia: SIP/2.0 192.0.2.1;branch=z9hG4bKx\n"
         "From: <sip:a@example.com>;tag=1\nTo: <sip:b@example.com>\nCall-ID: v\n"
         "CSeq: 1 OPTIONS\nl: 0\n\n"), "bad_request", 400),
    "bad_port_in_uri": (
        "OPTIONS sip:b@example.com:99999 SIP/2.0\n" + BASE_HEADERS + "CSeq: 1 OPTIONS\nl: 0\n\n",
        "bad_request_uri", 400),
    "continuation_first": (" folded\nOPTIONS sip:b@x SIP/2.0\n\n", "bad_folding", None),
    "never_ends": ("OPTIONS sip:b@example.com SIP/2.0\nVia: SIP/2.0/UDP x;branch=z9hG4bK1\n",
                   "no_end_of_headers", 400),
    "bad_status_code": (
        ("SIP/2.0 99 Odd\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\nFrom: <sip:a@x>;tag=1\n"
         "To: <sip:b@x>\nCall-ID: s\nCSeq: 1 INVITE\nl: 0\n\n"), "bad_status_line", None),
    "response_without_cseq": (
        ("SIP/2.0 200 OK\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\nFrom: <sip:a@x>;tag=1\n"
         "To: <sip:b@x>\nCall-ID: s\nl: 0\n\n"), "bad_response", None),
}


def test_the_valid_messages_are_read() -> None:
    VALID["bare_lf_line_ends"] = BASE_HEADERS.join(["OPTIONS sip:a@example.com SIP/2.0\n",
                                                    "CSeq: 1 OPTIONS\nl: 0\n\n"])
    for name, text in VALID.items():
        data = wire(text) if name != "bare_lf_line_ends" else text.encode()
        message = parse_message(data)
        assert isinstance(message, (SipRequest, SipResponse)), (name, message)
        assert message.call_id and message.vias and message.cseq.number >= 0, name
        assert parse_message(message.to_bytes()).__class__ is message.__class__, name


def test_what_the_valid_messages_say() -> None:
    folded = parse_message(wire(VALID["folded_and_spaced"]))
    assert isinstance(folded, SipRequest)
    assert folded.from_addr.display_name == 'Ann "the caller"'
    assert folded.from_addr.tag == "f00d" and folded.to_addr.tag == "77abc"
    assert (folded.cseq.number, folded.cseq.method) == (17, "INVITE")
    assert [via.branch for via in folded.vias] == ["z9hG4bKfold1", "z9hG4bKrelay",
                                                   "z9hG4bKlast"]
    assert folded.vias[1].transport == "TCP" and folded.vias[1].host == "relay.example.net"
    assert folded.headers.get("x-made-up") == "first part second part"
    assert folded.content_type == "application/sdp" and folded.body == SDP.encode()
    contact = parse_name_addr(folded.headers.get_all("m")[0])
    assert contact is not None and contact.param("q") == "0.5" and contact.param("foo") == "bar"
    escapes = parse_message(wire(VALID["escapes"]))
    assert isinstance(escapes, SipRequest)
    request_uri = parse_uri(escapes.uri)
    assert request_uri is not None and unescape(request_uri.user or "") == "sips:ann@example.com"
    assert unescape(escapes.from_addr.uri.user or "") == "I am spaced"
    two = parse_message(wire(VALID["two_in_one"]))
    assert isinstance(two, SipRequest) and two.method == "REGISTER" and two.body == b""
    ipv6 = parse_message(wire(VALID["ipv6_everywhere"]))
    assert isinstance(ipv6, SipRequest) and ipv6.top_via is not None
    assert ipv6.top_via.host == "2001:db8::9:1"
    assert parse_uri(ipv6.uri) == parse_uri("sip:user@[2001:db8::10]:5070")
    novel = parse_message(wire(VALID["unknown_scheme_in_to"]))
    assert isinstance(novel, SipRequest) and novel.to_addr.uri.scheme == "isbn"
    noreason = parse_message(wire(VALID["response_without_reason"]))
    assert isinstance(noreason, SipResponse) and (noreason.status, noreason.reason) == (100, "")
    odd = parse_message(wire(VALID["unusual_characters"]))
    assert isinstance(odd, SipRequest) and odd.method == "~odd-Method_0123.!%*+`'"


@pytest.mark.parametrize("name", sorted(INVALID))
def test_the_invalid_messages_are_refused(name: str) -> None:
    text, code, status = INVALID[name]
    failure = parse_message(wire(text) if "\n\n" in text else text.encode())
    assert isinstance(failure, ParseFailure), failure
    assert (failure.code, failure.status) == (code, status), failure


def test_size_limits_and_stream_framing() -> None:
    head = ("MESSAGE sip:b@example.com SIP/2.0\n" + BASE_HEADERS
            + "CSeq: 1 MESSAGE\nContent-Type: text/plain\n")
    huge = wire(head + f"Content-Length: {70_000}\n\n") + b"x" * 70_000
    too_large = parse_message(huge)
    assert isinstance(too_large, ParseFailure) and too_large.status == 413
    assert too_large.partial is not None and too_large.partial.call_id == "base@192.0.2.1"
    framed = frame_stream(huge)
    assert isinstance(framed, ParseFailure) and framed.status == 413
    assert isinstance(frame_stream(b"A" * (MAX_MESSAGE_BYTES + 10)), ParseFailure)
    small = wire(head + "Content-Length: 5\n\n") + b"hello"
    stream = b"\r\n\r\n" + small + small[:40]
    keepalive = frame_stream(stream)
    assert keepalive == Frame(b"", 4)
    frame = frame_stream(stream[4:])
    assert isinstance(frame, Frame) and frame.data == small
    assert frame_stream(stream[4 + frame.consumed:]) is None  # half a message: wait
    # Over a stream a message without Content-Length has no body.
    no_length = parse_message(wire(head.replace("MESSAGE", "OPTIONS") + "\n") + b"junk",
                              stream=True)
    assert isinstance(no_length, SipRequest) and no_length.body == b""


def test_headers_keep_order_and_expand_compact_forms() -> None:
    headers = Headers([("v", "SIP/2.0/UDP a;branch=z9hG4bK1, SIP/2.0/UDP b;branch=z9hG4bK2"),
                       ("f", "<sip:x@y>;tag=1"), ("Via", "SIP/2.0/UDP c;branch=z9hG4bK3")])
    assert len(headers.get_all("via")) == 3 and headers.get("From") == "<sip:x@y>;tag=1"
    headers.replace_values("via", ["SIP/2.0/UDP z;branch=z9hG4bK9"])
    assert [name for name, _ in headers] == ["Via", "From"]
    headers.set("X-Custom-Thing", "1")
    assert list(headers)[-1] == ("X-Custom-Thing", "1")


# -- random input ----------------------------------------------------------------------------

TEMPLATES = [wire(text) for text in VALID.values() if "\n\n" in text] + [
    wire(text) for text, _, _ in INVALID.values() if "\n\n" in text]


def check(data: bytes) -> None:
    for stream in (False, True):
        result = parse_message(data, stream=stream)
        assert not (isinstance(result, ParseFailure) and result.code == "internal_parse_error")
        if isinstance(result, (SipRequest, SipResponse)):
            # What was read can be read again, and says the same.
            again = parse_message(result.to_bytes(), stream=True)
            assert type(again) is type(result), (data, again)
            assert again.call_id == result.call_id and again.cseq == result.cseq
    frame_stream(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_never_break_the_parser(data: bytes) -> None:
    check(data)
    check(b"INVITE sip:a@b SIP/2.0\r\n" + data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TEMPLATES), st.lists(st.tuples(st.integers(0, 10_000),
                                                     st.sampled_from(["flip", "cut", "insert",
                                                                      "delete"]),
                                                     st.binary(min_size=1, max_size=8)),
                                           max_size=6))
def test_damaged_messages_never_break_the_parser(
    template: bytes, edits: list[tuple[int, str, bytes]],
) -> None:
    data = bytearray(template)
    for position, kind, chunk in edits:
        if not data:
            break
        index = position % len(data)
        if kind == "flip":
            data[index] ^= chunk[0] or 1
        elif kind == "cut":
            del data[index:]
        elif kind == "insert":
            data[index:index] = chunk
        else:
            del data[index: index + len(chunk)]
    check(bytes(data))
