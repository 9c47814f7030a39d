"""Credentials and query secrets are masked in every URL and log line the server writes."""

from __future__ import annotations

import logging

import pytest

from agent.logs.redact import MASK, RedactingFilter, redact_text, redact_url


@pytest.mark.parametrize("url, expected", [
    ("wss://user:hunter2@engine.example:8998/api/chat?api_key=sk-1&model=m",
     "wss://***@engine.example:8998/api/chat?api_key=***&model=m"),
    ("https://engine/x?Token=a&X-Api-Key=b&secret=c&PASSWORD=d&keep=1",
     "https://engine/x?Token=***&X-Api-Key=***&secret=***&PASSWORD=***&keep=1"),
    ("ws://tok@host/", "ws://***@host/"),
    ("ws://a:b@c@host:1?x=1#access_token=zz", "ws://***@host:1?x=1#access_token=***"),
    ("http://host/path/with@at?q=1", "http://host/path/with@at?q=1"),  # @ after the host
    ("ws://host/?keyboard=1&key=", "ws://host/?keyboard=1&key="),
    ("ws://host/?api%5Fkey=s", "ws://host/?api%5Fkey=***"),
    ("turn:turn.example:3478?transport=udp", "turn:turn.example:3478?transport=udp"),
])
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert redact_url(expected) == expected


def test_redact_text_finds_urls_pairs_and_path_tokens() -> None:
    line = ("upstream ws://u:pw@h:1/x?token=t1 failed; GET /v1/telephony/media-stream/sk-2"
            "?token=sk-3 HTTP/1.1 'ws://v:pw2@h2/'")
    redacted = redact_text(line, ["/v1/telephony/media-stream"])
    for secret in ("pw@", "t1", "sk-2", "sk-3", "pw2"):
        assert secret not in redacted
    assert redacted.count(MASK) == 5
    assert "ws://***@h:1/x?token=***" in redacted


def test_filter_rewrites_records_that_carry_secrets() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "connect %s in %d ms",
                               ("wss://a:b@h/?key=k", 5), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "connect wss://***@h/?key=*** in 5 ms"
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "n=%d", (3,), None)
    RedactingFilter().filter(plain)
    assert plain.args == (3,)  # untouched when there is nothing to hide


@pytest.mark.parametrize("line", [
    "GET /v1/telephony/media%2Dstream/sk-9 HTTP/1.1",
    "GET /v1/telephony/media%2dstream/sk-9?x=1 HTTP/1.1",
    "GET /v1/telephony/%6D%65%64ia-stream/sk-9 HTTP/1.1",
    "GET /v1/telephony/media-stream%2Fsk-9 HTTP/1.1",
    '"GET /v1/telephony/media-stream/%73k-9 HTTP/1.1" 400',
    "upstream http://h:1/v1/telephony/media%2Dstream/sk-9 refused",
])
def test_percent_encoded_secret_paths_are_masked_as_the_router_reads_them(line: str) -> None:
    redacted = redact_text(line, ["/v1/telephony/media-stream"])
    assert "sk-9" not in redacted and "%73k-9" not in redacted
    assert "/v1/telephony/media-stream/***" in redacted  # written back in the plain spelling


def test_decoding_lets_no_control_character_or_other_path_through() -> None:
    prefixes = ["/v1/telephony/media-stream"]
    redacted = redact_text("GET /v1/telephony/media%2Dstream/sk-9/%0Aforged HTTP/1.1", prefixes)
    assert redacted == "GET /v1/telephony/media-stream/***/%0Aforged HTTP/1.1"
    for kept in ("GET /v1/models/a%2Db HTTP/1.1", "GET /v1/telephony/media-stream HTTP/1.1",
                 "/v1/telephony/media-stream/ ok"):
        assert redact_text(kept, prefixes) == kept
