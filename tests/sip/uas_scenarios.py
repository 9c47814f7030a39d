"""sipp UAS scenarios: sipp as the far end of the agent's outbound calls (answer, busy, no
answer, a digest challenge checked with `verifyauth`, a transfer accepted with NOTIFY)."""

from __future__ import annotations

REPLY_HEADERS = """[last_Via:]
[last_From:]
[last_To:]TAG
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:sipp@[local_ip]:[local_port];transport=[transport]>"""

ANSWER_SDP = """v=0
o=sipp 1 1 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0 101
a=rtpmap:0 PCMU/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
a=sendrecv"""


def scenario(name: str, body: str) -> str:
    return (f'<?xml version="1.0" encoding="ISO-8859-1" ?>\n<scenario name="{name}">\n'
            f"{body}\n</scenario>\n")


def reply(status: str, body: str = "", retrans: bool = False, tag: bool = True) -> str:
    """A response to the last request; `tag`: add sipp's To tag (not in a dialog yet)."""
    headers = REPLY_HEADERS.replace("TAG", ";tag=[pid]SIPpTag01[call_number]" if tag else "")
    content = (f"Content-Type: application/sdp\nContent-Length: [len]\n\n{body}" if body
               else "Content-Length: 0\n")
    attrs = ' retrans="500"' if retrans else ""
    return f"<send{attrs}><![CDATA[\nSIP/2.0 {status}\n{headers}\n{content}\n]]></send>"


def answer_then_hangup_from_agent() -> str:
    """Ring, early media (183 with SDP), answer with PCMU (sipp echoes the agent's RTP back:
    -rtp_echo), wait for the agent's BYE."""
    return scenario("answer", "\n".join([
        '<recv request="INVITE"/>', reply("180 Ringing"),
        reply("183 Session Progress", ANSWER_SDP), reply("200 OK", ANSWER_SDP, True),
        '<recv request="ACK"/>', '<recv request="BYE" timeout="20000"/>',
        reply("200 OK", tag=False)]))


def final_failure(status: str) -> str:
    return scenario("failure", "\n".join([
        '<recv request="INVITE"/>', reply("100 Trying"), reply(status), '<recv request="ACK"/>']))


def ring_until_cancelled() -> str:
    """180, then the CANCEL: 200 to it and 487 to the INVITE (CSeq 1: no challenge here)."""
    return scenario("no-answer", "\n".join([
        '<recv request="INVITE"/>', reply("180 Ringing"),
        '<recv request="CANCEL" timeout="20000"/>', reply("200 OK"),
        "<send><![CDATA[\nSIP/2.0 487 Request Terminated\n[last_Via:]\n[last_From:]\n"
        "[last_To:];tag=[pid]SIPpTag01[call_number]\n[last_Call-ID:]\nCSeq: 1 INVITE\n"
        "Content-Length: 0\n\n]]></send>",
        '<recv request="ACK"/>']))


def challenge(realm: str, qop: bool, proxy: bool = False) -> str:
    qop_param = ', qop="auth"' if qop else ""
    headers = REPLY_HEADERS.replace("TAG", ";tag=[pid]SIPpTag01[call_number]")
    status, header = (("407 Proxy Authentication Required", "Proxy-Authenticate") if proxy
                      else ("401 Unauthorized", "WWW-Authenticate"))
    return (f"<send><![CDATA[\nSIP/2.0 {status}\n" + headers + "\n"
            f'{header}: Digest realm="{realm}", nonce="[pid]n[call_number]x"'
            f"{qop_param}, algorithm=MD5\nContent-Length: 0\n\n]]></send>")


def digest_checked(username: str, password: str, qop: bool, proxy: bool = False) -> str:
    """401 (or 407), then the retried INVITE's credentials checked by sipp itself
    (verifyauth): 200 when right, 403 when wrong."""
    return scenario("digest", "\n".join([
        '<recv request="INVITE"/>', challenge("sipp.test", qop, proxy), '<recv request="ACK"/>',
        '<recv request="INVITE">',
        f'  <action><verifyauth assign_to="authvalid" username="{username}" '
        f'password="{password}"/></action>',
        "</recv>",
        '<nop hide="true" test="authvalid" next="good"/>',
        reply("403 Forbidden"), '<recv request="ACK" next="end"/>',
        '<label id="good"/>',
        reply("200 OK", ANSWER_SDP, True), '<recv request="ACK"/>',
        '<recv request="BYE" timeout="20000"/>', reply("200 OK", tag=False),
        '<label id="end"/>']))


def challenged_twice() -> str:
    return scenario("challenged-twice", "\n".join([
        '<recv request="INVITE"/>', challenge("sipp.test", True), '<recv request="ACK"/>',
        '<recv request="INVITE"/>', challenge("sipp.test", True), '<recv request="ACK"/>']))


def accept_transfer() -> str:
    """Answer, accept the agent's REFER (202), report the new call's 200 in a NOTIFY, then
    take the agent's BYE."""
    notify = (
        "<send retrans=\"500\"><![CDATA[\nNOTIFY [$agent_contact] SIP/2.0\n"
        "Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]\n"
        "From: [$to_party]\nTo: [$from_party]\n[last_Call-ID:]\nCSeq: 1 NOTIFY\n"
        "Contact: <sip:sipp@[local_ip]:[local_port];transport=[transport]>\n"
        "Max-Forwards: 70\nEvent: refer\nSubscription-State: terminated;reason=noresource\n"
        "Content-Type: message/sipfrag;version=2.0\nContent-Length: [len]\n\n"
        "SIP/2.0 200 OK\n]]></send>")
    return scenario("transfer", "\n".join([
        '<recv request="INVITE"/>', reply("200 OK", ANSWER_SDP, True), '<recv request="ACK"/>',
        '<recv request="REFER" timeout="20000">',
        '  <action>',
        '    <ereg regexp=".*" search_in="hdr" header="From:" assign_to="from_party"/>',
        '    <ereg regexp=".*" search_in="hdr" header="To:" assign_to="to_party"/>',
        '    <ereg regexp="sip:[^>]*" search_in="hdr" header="Contact:" '
        'assign_to="agent_contact"/>',
        '  </action>',
        '</recv>',
        "<send><![CDATA[\nSIP/2.0 202 Accepted\n[last_Via:]\n[last_From:]\n[last_To:]\n"
        "[last_Call-ID:]\n[last_CSeq:]\nContent-Length: 0\n\n]]></send>",
        notify, '<recv response="200"/>',
        '<recv request="BYE" timeout="20000"/>', reply("200 OK", tag=False)]))


def two_forks_answer() -> str:
    """Two 2xx with different To tags (a forking proxy): the agent keeps the first, ACKs and
    BYEs the second, and later hangs up the first. The second is sent after the first's ACK,
    from the INVITE's headers kept in variables (sipp's [last_*] are the ACK's by then)."""
    keep = "\n".join(
        f'    <ereg regexp=".*" search_in="hdr" header="{name}:" assign_to="{var}"/>'
        for name, var in (("Via", "inv_via"), ("From", "inv_from"), ("To", "inv_to"),
                          ("Call-ID", "inv_call")))
    second = ("<send><![CDATA[\nSIP/2.0 200 OK\nVia: [$inv_via]\nFrom: [$inv_from]\n"
              "To: [$inv_to];tag=[pid]SIPpFork02[call_number]\nCall-ID: [$inv_call]\n"
              "CSeq: 1 INVITE\nContact: <sip:sipp@[local_ip]:[local_port];transport=[transport]>"
              "\nContent-Type: application/sdp\nContent-Length: [len]\n\n"
              + ANSWER_SDP + "\n]]></send>")
    return scenario("forks", "\n".join([
        f'<recv request="INVITE"><action>\n{keep}\n</action></recv>',
        reply("200 OK", ANSWER_SDP, True), '<recv request="ACK"/>',
        second, '<recv request="ACK"/>',
        '<recv request="BYE" timeout="10000"/>', reply("200 OK", tag=False),
        '<recv request="BYE" timeout="20000"/>', reply("200 OK", tag=False)]))


def proxy_challenge() -> str:
    """407 with Proxy-Authenticate, then the retried INVITE answered 200 (sipp's verifyauth
    reads Authorization only: the test checks Proxy-Authorization itself)."""
    return scenario("proxy-digest", "\n".join([
        '<recv request="INVITE"/>', challenge("proxy.test", True, proxy=True),
        '<recv request="ACK"/>', '<recv request="INVITE"/>',
        reply("200 OK", ANSWER_SDP, True), '<recv request="ACK"/>',
        '<recv request="BYE" timeout="20000"/>', reply("200 OK", tag=False)]))
