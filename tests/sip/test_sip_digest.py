"""Digest answers (signaling/sip/digest.py) against the worked examples of RFC 2617 §3.5
and RFC 7616 §3.9.1, and challenge parsing."""

from __future__ import annotations

import hashlib

from signaling.sip.digest import (
    Challenge,
    Credentials,
    answer,
    best_challenge,
    parse_challenge,
    parse_params,
    response_value,
)

RFC7616_NONCE = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v"
RFC7616_CNONCE = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
MUFASA_7616 = Credentials("Mufasa", "Circle of Life")


def test_rfc2617_worked_example() -> None:
    challenge = parse_challenge('Digest realm="testrealm@host.com", qop="auth,auth-int", '
                                'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", '
                                'opaque="5ccc069c403ebaf9f0171e9517f40e41"')
    assert challenge is not None and challenge.qop == ("auth", "auth-int")
    value = response_value(challenge, Credentials("Mufasa", "Circle Of Life"), "GET",
                           "/dir/index.html", "0a4f113b", 1)
    assert value == "6629fae49393a05397450978507c4ef1"


def test_rfc7616_md5_example() -> None:
    challenge = Challenge(realm="http-auth@example.org", nonce=RFC7616_NONCE, algorithm="MD5",
                          qop=("auth", "auth-int"))
    assert (response_value(challenge, MUFASA_7616, "GET", "/dir/index.html", RFC7616_CNONCE)
            == "8ca523f5e9506fed4657c9700eebdbec")


def test_rfc7616_sha256_example() -> None:
    challenge = Challenge(realm="http-auth@example.org", nonce=RFC7616_NONCE,
                          algorithm="SHA-256", qop=("auth", "auth-int"))
    assert (response_value(challenge, MUFASA_7616, "GET", "/dir/index.html", RFC7616_CNONCE)
            == "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1")


def test_without_qop_is_rfc2069_style() -> None:
    challenge = Challenge(realm="r", nonce="n")
    ha1 = hashlib.md5(b"u:r:p").hexdigest()
    ha2 = hashlib.md5(b"INVITE:sip:bob@example.com").hexdigest()
    expected = hashlib.md5(f"{ha1}:n:{ha2}".encode()).hexdigest()
    header = answer(challenge, Credentials("u", "p"), "INVITE", "sip:bob@example.com")
    assert header is not None and f'response="{expected}"' in header
    assert "qop" not in header and "cnonce" not in header


def test_md5_sess() -> None:
    challenge = Challenge(realm="r", nonce="n", algorithm="MD5-SESS", qop=("auth",))
    ha1 = hashlib.md5(hashlib.md5(b"u:r:p").hexdigest().encode() + b":n:c").hexdigest()
    ha2 = hashlib.md5(b"INVITE:sip:x@y").hexdigest()
    expected = hashlib.md5(f"{ha1}:n:00000001:c:auth:{ha2}".encode()).hexdigest()
    assert response_value(challenge, Credentials("u", "p"), "INVITE", "sip:x@y", "c") == expected


def test_answer_carries_every_field() -> None:
    challenge = parse_challenge('Digest realm="sip.example", nonce="abc", qop="auth", '
                                'opaque="op", algorithm=SHA-256')
    assert challenge is not None
    header = answer(challenge, Credentials("alice", "pw"), "INVITE", "sip:bob@sip.example",
                    cnonce="cn", nc=1)
    assert header is not None and header.startswith("Digest ")
    params = parse_params(header.removeprefix("Digest "))
    assert params is not None
    assert params["username"] == "alice" and params["realm"] == "sip.example"
    assert params["uri"] == "sip:bob@sip.example" and params["qop"] == "auth"
    assert params["nc"] == "00000001" and params["cnonce"] == "cn"
    assert params["opaque"] == "op" and params["algorithm"] == "SHA-256"
    assert params["response"] == response_value(challenge, Credentials("alice", "pw"),
                                                "INVITE", "sip:bob@sip.example", "cn")


def test_strongest_challenge_wins() -> None:
    chosen = best_challenge(['Digest realm="r", nonce="1", algorithm=MD5',
                             'Digest realm="r", nonce="2", algorithm=SHA-256',
                             'Basic realm="r"'])
    assert chosen is not None and chosen.algorithm == "SHA-256" and chosen.nonce == "2"


def test_unusable_challenges() -> None:
    assert parse_challenge('Basic realm="r"') is None
    assert parse_challenge('Digest realm="r"') is None  # no nonce
    assert parse_challenge('Digest realm="r, nonce="x"') is None  # unclosed quote
    assert best_challenge(['Digest realm="r", nonce="n", algorithm=SHA-512-256']) is None
    only_int = parse_challenge('Digest realm="r", nonce="n", qop="auth-int"')
    assert only_int is not None and not only_int.supported
    assert answer(only_int, Credentials("u", "p"), "INVITE", "sip:x@y") is None


def test_password_never_in_repr() -> None:
    assert "secret" not in repr(Credentials("u", "secret"))
