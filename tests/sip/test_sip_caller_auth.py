"""Digest authentication of callers (signaling/sip/caller_auth.py, `--sip-auth-file`): the
file's checks, challenges answered by the agent's own digest client (digest.py) in MD5 and
SHA-256, stale and foreign nonces, replays, 403 for wrong credentials; then sipp as the
caller with `-au/-ap` and its `[authentication]` keyword: challenged, answered, served; a
wrong password gets 403."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from signaling.sip import caller_auth
from signaling.sip.caller_auth import CallerAuth, CallerAuthSettings, load_auth_file
from signaling.sip.config import SipConfig
from signaling.sip.digest import (
    Credentials,
    answer,
    best_challenge,
    parse_challenge,
    response_from_ha1,
)
from signaling.sip.message import SipRequest
from signaling.sip.sdp import SessionDescription, parse_sdp
from tests.sip.helpers import (
    HOST,
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServerFactory,
    hang_up,
    run_sipp,
    sdp_offer,
)
from tests.sip.test_sip_cli import run as run_server
from tests.support.agents import wait_until

REALM = "agent.test"
BOB_HA1 = hashlib.md5(f"bob:{REALM}:hunter2".encode()).hexdigest()


def write_auth(path: Path, data: object) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def settings(tmp_path: Path) -> CallerAuthSettings:
    return load_auth_file(write_auth(tmp_path / "auth.json", {
        "realm": REALM, "users": {"alice": "s3cret", "bob": {"ha1": BOB_HA1}}}))


@pytest.mark.parametrize("data, complaint", [
    ([], "must be an object"),
    ({"realm": REALM, "users": {}, "extra": 1}, "must be an object"),
    ({"users": {"a": "b"}}, '"realm"'),
    ({"realm": 'a"b', "users": {"a": "b"}}, '"realm"'),
    ({"realm": REALM, "users": {}}, '"users"'),
    ({"realm": REALM, "users": {"a": ""}}, "user 'a'"),
    ({"realm": REALM, "users": {"a": {"ha1": "xyz"}}}, "user 'a'"),
    ({"realm": REALM, "users": {"a:b": "pw"}}, "user names"),
])
def test_a_bad_auth_file_is_refused_naming_the_problem_never_the_secret(
    tmp_path: Path, data: object, complaint: str,
) -> None:
    with pytest.raises(ValueError) as error:
        load_auth_file(write_auth(tmp_path / "auth.json", data))
    assert complaint in str(error.value) and "--sip-auth-file" in str(error.value)
    with pytest.raises(ValueError, match="cannot read"):
        load_auth_file(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON"):
        load_auth_file(str(tmp_path / "bad.json"))


def test_settings_never_show_a_password(settings: CallerAuthSettings) -> None:
    assert "s3cret" not in repr(settings) and BOB_HA1 not in repr(settings)
    assert "s3cret" not in repr(settings.users["alice"])


def invite(authorization: str | None = None) -> SipRequest:
    dialogue = Dialogue(5999, (HOST, 5060))
    headers = [("Authorization", authorization)] if authorization else []
    return dialogue.request("INVITE", body=sdp_offer(4000), headers=headers)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def challenged(auth: CallerAuth, algorithm: str, stale: bool = False) -> list[str]:
    refusal = auth.check(invite())
    assert refusal is not None and refusal.status == 401
    values = [value for name, value in refusal.headers if name == "WWW-Authenticate"]
    assert [parse_challenge(v).algorithm for v in values  # type: ignore[union-attr]
            ] == ["MD5", "SHA-256"]
    return [v for v in values if f"algorithm={algorithm}," in v]


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
def test_a_challenge_answered_with_the_right_password_is_taken_once(
    settings: CallerAuthSettings, algorithm: str,
) -> None:
    auth = CallerAuth(settings)
    (value,) = challenged(auth, algorithm)
    challenge = parse_challenge(value)
    assert challenge is not None and challenge.qop == ("auth",) and challenge.realm == REALM
    request = invite()
    good = answer(challenge, Credentials("alice", "s3cret"), "INVITE", request.uri)
    assert good is not None
    assert auth.check(invite(good)) is None
    replay = auth.check(invite(good))  # the same nonce and count again
    assert replay is not None and replay.status == 401 and replay.code == "auth_stale"
    wrong = answer(challenge, Credentials("alice", "guess"), "INVITE", request.uri)
    assert wrong is not None
    refused = auth.check(invite(wrong))
    assert refused is not None and (refused.status, refused.headers) == (403, [])
    stranger = answer(challenge, Credentials("mallory", "s3cret"), "INVITE", request.uri)
    assert stranger is not None and auth.check(invite(stranger)).status == 403  # type: ignore[union-attr]
    elsewhere = answer(challenge, Credentials("alice", "s3cret"), "INVITE", "sip:x@elsewhere")
    assert elsewhere is not None and auth.check(invite(elsewhere)).status == 403  # type: ignore[union-attr]


def test_a_user_kept_as_ha1_answers_md5_only(settings: CallerAuthSettings) -> None:
    auth = CallerAuth(settings)
    uri = invite().uri
    for algorithm, served in (("MD5", True), ("SHA-256", False)):
        (value,) = challenged(auth, algorithm)
        challenge = parse_challenge(value)
        assert challenge is not None
        reply = answer(challenge, Credentials("bob", "hunter2"), "INVITE", uri)
        assert reply is not None
        assert (auth.check(invite(reply)) is None) == served


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
def test_an_unknown_user_takes_the_same_hashing_and_compare_as_a_known_one(
    settings: CallerAuthSettings, algorithm: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No timing here: the path itself. Every wrong answer (a user with a wrong password, a
    name that is no user, an HA1-only user answering SHA-256) computes one response from an
    HA1 of the algorithm's size and compares it in constant time; no name is hashed per
    request (HA1s are made at start-up)."""
    auth = CallerAuth(settings)
    calls: list[tuple[str, ...]] = []
    real_response, real_compare = response_from_ha1, hmac.compare_digest

    def response(algorithm: str, ha1: str, *rest: object) -> str:
        calls.append(("response", algorithm, str(len(ha1))))
        return real_response(algorithm, ha1, *rest)  # type: ignore[arg-type]

    def compare(a: str, b: str) -> bool:
        calls.append(("compare", str(len(a)), str(len(b))))
        return real_compare(a, b)

    def user_hash(*args: object) -> str:
        calls.append(("user_hash",))
        return ""

    monkeypatch.setattr(caller_auth, "response_from_ha1", response)
    monkeypatch.setattr(hmac, "compare_digest", compare)
    monkeypatch.setattr(caller_auth, "user_hash", user_hash)
    uri = invite().uri
    paths = {}
    for name, password in (("alice", "guess"), ("mallory", "guess"), ("bob", "guess")):
        (value,) = challenged(auth, algorithm)
        challenge = parse_challenge(value)
        assert challenge is not None
        reply = answer(challenge, Credentials(name, password), "INVITE", uri)
        assert reply is not None
        calls.clear()
        refused = auth.check(invite(reply))
        assert refused is not None and refused.status == 403
        paths[name] = list(calls)
    size = {"MD5": "32", "SHA-256": "64"}[algorithm]
    nonce_check = ("compare", "32", "32")  # the nonce's MAC, before the answer is looked at
    expected = [nonce_check, ("response", algorithm, size), ("compare", size, size)]
    assert paths == {"alice": expected, "mallory": expected, "bob": expected}


def test_an_expired_nonce_is_stale_and_a_forged_one_gets_a_fresh_challenge(
    settings: CallerAuthSettings,
) -> None:
    clock = Clock()
    auth = CallerAuth(settings, nonce_seconds=300, clock=clock)
    (value,) = challenged(auth, "MD5")
    challenge = parse_challenge(value)
    assert challenge is not None
    uri = invite().uri
    clock.now += 301
    late = answer(challenge, Credentials("alice", "s3cret"), "INVITE", uri)
    assert late is not None
    stale = auth.check(invite(late))
    assert stale is not None and stale.status == 401
    assert all("stale=true" in v for _, v in stale.headers)
    late_wrong = answer(challenge, Credentials("alice", "nope"), "INVITE", uri)
    assert late_wrong is not None
    assert auth.check(invite(late_wrong)).status == 403  # type: ignore[union-attr]
    other_server = CallerAuth(settings, clock=clock)  # another key: its nonces are foreign
    fresh = auth.check(invite())
    assert fresh is not None
    (mine,) = [v for _, v in fresh.headers if "algorithm=MD5," in v]
    mine_parsed = parse_challenge(mine)
    assert mine_parsed is not None
    theirs = answer(mine_parsed, Credentials("alice", "s3cret"), "INVITE", uri)
    foreign = other_server.check(invite(theirs))
    assert foreign is not None and foreign.status == 401 and foreign.code == "auth_challenged"
    assert auth.check(invite('Digest username="alice", nonce="x')).status == 403  # type: ignore[union-attr]
    # CANCEL, OPTIONS and ACK are never challenged.
    for method in ("CANCEL", "OPTIONS", "ACK"):
        assert auth.check(Dialogue(5999, (HOST, 5060)).request(method)) is None


async def test_on_the_wire_a_challenged_invite_retried_with_credentials_is_answered(
    start_sip: SipServerFactory, settings: CallerAuthSettings,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, caller_auth=settings))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    first = dialogue.request("INVITE", body=sdp_offer(probe.port))
    peer.send(first, server.sip)
    unauthorized = await peer.response(401)
    assert len(unauthorized.headers.lines("www-authenticate")) == 2
    peer.send(dialogue.request("ACK", cseq=1, branch=first.top_via.branch,  # type: ignore[union-attr]
                               to_tag=unauthorized.to_addr.tag), server.sip)
    challenge = best_challenge(unauthorized.headers.lines("www-authenticate"))
    assert challenge is not None and challenge.algorithm == "SHA-256"  # the stronger one
    dialogue.cseq = 2
    credentials = answer(challenge, Credentials("alice", "s3cret"), "INVITE", first.uri)
    assert credentials is not None
    second = dialogue.request("INVITE", body=sdp_offer(probe.port),
                              headers=[("Authorization", credentials)])
    peer.send(second, server.sip)
    ok = await peer.response(200)
    assert isinstance(parse_sdp(ok.body), SessionDescription)
    peer.send(dialogue.ack_for(second, ok), server.sip)
    assert server.sip_legs() == 1 and server.ua.counters["auth_challenged"] == 1
    # OPTIONS (a probe) is served without credentials; a BYE in the dialog is too.
    peer.send(Dialogue(peer.port, server.sip).request("OPTIONS"), server.sip)
    await peer.response(200, method="OPTIONS")
    await hang_up(server, peer, dialogue, probe)


def auth_scenario(final: str) -> str:
    """sipp: INVITE, 401 (auth="true"), ACK, INVITE with [authentication], then `final`
    (200: ACK, BYE; 403: its ACK)."""
    via = "Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=z9hG4bK-{branch}-[call_number]"
    request_head = "      " + via + """
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>{to_tag}
      Call-ID: [call_id]
      CSeq: {cseq} {method}
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70"""
    body = """
v=0
o=sipp 1 1 IN IP4 [local_ip]
s=-
c=IN IP4 [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000"""

    def send(method: str, cseq: int, branch: str, extra: str = "", sdp: bool = False,
             to_tag: str = "", uri: str = "sip:agent@[remote_ip]:[remote_port]",
             retrans: bool = True) -> str:
        head = request_head.format(branch=branch, cseq=cseq, method=method, to_tag=to_tag)
        content = ("      Content-Type: application/sdp\n      Content-Length: [len]\n\n"
                   + body) if sdp else "      Content-Length: 0\n"
        retransmit = ' retrans="500"' if retrans else ""
        return (f"  <send{retransmit}>\n    <![CDATA[\n"
                f"      {method} {uri} SIP/2.0\n{head}\n{extra}{content}\n    ]]>\n  </send>\n")

    steps = [send("INVITE", 1, "a1", sdp=True),
             '  <recv response="100" optional="true"/>\n',
             '  <recv response="401" auth="true"/>\n',
             send("ACK", 1, "a1", to_tag="[peer_tag_param]", retrans=False),
             send("INVITE", 2, "a2", extra="      [authentication]\n", sdp=True),
             '  <recv response="100" optional="true"/>\n',
             '  <recv response="180" optional="true"/>\n']
    if final == "200":
        steps += ['  <recv response="200"/>\n',
                  send("ACK", 2, "a3", to_tag="[peer_tag_param]", retrans=False),
                  '  <pause milliseconds="300"/>\n',
                  send("BYE", 3, "a4", to_tag="[peer_tag_param]"),
                  '  <recv response="200"/>\n']
    else:
        steps += [f'  <recv response="{final}"/>\n',
                  send("ACK", 2, "a2", to_tag="[peer_tag_param]", retrans=False)]
    return ('<?xml version="1.0" encoding="ISO-8859-1" ?>\n<scenario name="caller auth">\n'
            + "".join(steps) + "</scenario>\n")


@pytest.mark.interop
@pytest.mark.parametrize("password, final", [("s3cret", "200"), ("wrong", "403")])
async def test_sipp_answers_the_challenge_with_its_authentication_keyword(
    start_sip: SipServerFactory, settings: CallerAuthSettings, tmp_path: Path, password: str,
    final: str,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, caller_auth=settings))
    # The digest's uri must be the Request-URI (RFC 7616 §3.4.6); sipp's default is
    # sip:HOST:PORT, the Request-URI here has a user part (sipp writes the "sip:" itself).
    request_uri = f"agent@{server.sip[0]}:{server.sip[1]}"
    run = await run_sipp(server.sip, tmp_path, "-m", "1", "-au", "alice", "-ap", password,
                         "-auth_uri", request_uri, scenario=auth_scenario(final), timeout=20)
    assert run.returncode == 0, run.explain()
    assert run.count("SIP/2.0 401", "received") == 1, run.explain()
    assert run.count("SIP/2.0 " + final, "received") >= 1, run.explain()
    counters = server.ua.counters
    assert counters["auth_challenged"] == 1
    assert counters["answered"] == (1 if final == "200" else 0)
    assert counters["auth_failed"] == (1 if final == "403" else 0)
    await wait_until(server.quiet)


@pytest.mark.slow
async def test_a_bad_auth_file_stops_the_server_with_one_coded_line(tmp_path: Path) -> None:
    bad = write_auth(tmp_path / "auth.json", {"realm": REALM, "users": {"eve": ""},
                                              "secret": "hunter2"})
    code, err = await run_server("--sip-listen", f"{HOST}:0", "--sip-auth-file", bad)
    assert code == 2 and "error [sip_config_invalid]" in err and "--sip-auth-file" in err
    assert "hunter2" not in err and "Traceback" not in err
    code, err = await run_server("--sip-listen", f"{HOST}:0", "--sip-srtp", "maybe")
    assert code == 2 and "--sip-srtp" in err
