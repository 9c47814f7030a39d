"""sipp scenarios (XML) for the interop tests; `__NAME__` placeholders are filled per test.

sipp keywords used: [remote_ip]/[remote_port] (the agent), [local_ip]/[local_port] (sipp),
[call_id], [call_number], [pid], [len], [next_url]/[routes] (learned from the 200 with
rrs="true"), [last_X:] (the header X of the last message received), [peer_tag_param]
(the agent's tag)."""

from __future__ import annotations

HEADER = '<?xml version="1.0" encoding="ISO-8859-1" ?>\n'

FROM = "From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]"
CONTACT = "Contact: <sip:sipp@[local_ip]:[local_port];transport=[transport]>"


def _offer(port: str, direction: str = "") -> str:
    lines = ["v=0", "o=sipp 1 __VERSION__ IN IP[local_ip_type] [local_ip]", "s=-",
             "c=IN IP[media_ip_type] [media_ip]", "t=0 0", f"m=audio {port} RTP/AVP 0 101",
             "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-16"]
    if direction:
        lines.append(f"a={direction}")
    return "\n".join(lines)


def invite(branch: str = "[branch]", port: str = "__MEDIA_PORT__", cseq: int = 1,
           retrans: bool = True, attributes: str = "") -> str:
    retransmit = ' retrans="500"' if retrans else ""
    return f"""  <send{retransmit}{attributes}>
    <![CDATA[
      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch={branch}
      {FROM}
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: {cseq} INVITE
      {CONTACT}
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

{_offer(port).replace("__VERSION__", "1")}
    ]]>
  </send>
"""


def in_dialog(method: str, cseq: int, body: str = "", retrans: bool = True) -> str:
    content = "Content-Type: application/sdp\n      " if body else ""
    retransmit = ' retrans="500"' if retrans else ""
    return f"""  <send{retransmit}>
    <![CDATA[
      {method} [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [routes]
      {FROM}
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: {cseq} {method}
      {CONTACT}
      Max-Forwards: 70
      {content}Content-Length: [len]

{body}
    ]]>
  </send>
"""


def ack(cseq: int = 1) -> str:
    return in_dialog("ACK", cseq, retrans=False)


def establish(media_port: str = "__MEDIA_PORT__") -> str:
    return (invite(port=media_port)
            + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180" optional="true"/>\n'
            + '  <recv response="200" rtd="true" rrs="true"/>\n'
            + ack())


def hang_up(cseq: int = 2) -> str:
    return in_dialog("BYE", cseq) + '  <recv response="200" crlf="true"/>\n'


def reply(status: str) -> str:
    """sipp's answer `status` ("200 OK"), without a body, to the request it received last."""
    return f"""  <send>
    <![CDATA[
      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0
    ]]>
  </send>
"""


def scenario(name: str, body: str) -> str:
    return HEADER + f'<scenario name="{name}">\n{body}</scenario>\n'


ANSWER = '  <recv response="200" rtd="true" rrs="true"/>\n'


def call_with_echo(wav: str, play_ms: int) -> str:
    """Call, stream the WAV as PCMU once the call is up, wait, hang up."""
    body = (invite() + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180" optional="true"/>\n' + ANSWER + ack()
            + f'  <nop><action><exec rtp_stream="{wav},1,0"/></action></nop>\n'
            + f'  <pause milliseconds="{play_ms}"/>\n' + hang_up())
    return scenario("echo call", body)


def ack_non_2xx(branch: str) -> str:
    """The ACK of a final answer above 2xx to the first INVITE: on that INVITE's own
    `branch` (RFC 3261 §17.1.1.3), its To (with the tag) from the answer."""
    return f"""  <send>
    <![CDATA[
      ACK sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch={branch}
      {FROM}
      [last_To:]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
"""


def cancel_before_answer() -> str:
    branch = "z9hG4bK-[pid]-[call_number]-invite"
    body = (invite(branch=branch)
            + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180"/>\n'
            + f"""  <send>
    <![CDATA[
      CANCEL sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch={branch}
      {FROM}
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 CANCEL
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200"/>
  <recv response="487"/>
"""
            + ack_non_2xx(branch)
            + '  <pause milliseconds="500"/>\n')
    return scenario("cancel before answer", body)


def deaf_to_provisionals() -> str:
    """sipp 'loses' every 100 and 180, so it keeps retransmitting its INVITE (Timer A)
    until the 200 comes."""
    body = (invite()
            + '  <recv response="100" optional="true" lost="100"/>\n'
            + '  <recv response="180" optional="true" lost="100"/>\n'
            + ANSWER + ack() + '  <pause milliseconds="300"/>\n' + hang_up())
    return scenario("deaf to provisionals", body)


def hold_and_resume() -> str:
    def reinvite(cseq: int, direction: str, expect: str) -> str:
        offer = _offer("__MEDIA_PORT__", direction).replace("__VERSION__", str(cseq))
        return (in_dialog("INVITE", cseq, body=offer)
                + f"""  <recv response="100" optional="true"/>
  <recv response="200">
    <action><ereg regexp="a={expect}" search_in="body" check_it="true" assign_to="d{cseq}"/>
    </action>
  </recv>
""" + in_dialog("ACK", cseq, retrans=False) + '  <pause milliseconds="300"/>\n')

    body = (invite() + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180" optional="true"/>\n' + ANSWER + ack()
            + '  <pause milliseconds="300"/>\n'
            + reinvite(2, "sendonly", "recvonly") + reinvite(3, "inactive", "inactive")
            + reinvite(4, "sendrecv", "sendrecv") + hang_up(5)
            + '  <Reference variables="d2,d3,d4"/>\n')  # assigned only to be checked
    return scenario("hold and resume", body)


def agent_hangs_up() -> str:
    """Call, then wait for the agent's BYE and answer it."""
    body = (invite() + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180" optional="true"/>\n' + ANSWER + ack()
            + '  <recv request="BYE" timeout="20000"/>\n' + reply("200 OK")
            + '  <pause milliseconds="200"/>\n')
    return scenario("agent hangs up", body)


def options() -> str:
    return scenario("options", """  <send retrans="500">
    <![CDATA[
      OPTIONS sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      """ + FROM + """
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 OPTIONS
      Max-Forwards: 70
      Accept: application/sdp
      Content-Length: 0
    ]]>
  </send>
  <recv response="200">
    <action><ereg regexp="INVITE, ACK, BYE, CANCEL, OPTIONS" search_in="hdr" header="Allow:"
      check_it="true" assign_to="allow"/></action>
  </recv>
  <Reference variables="allow"/>
""")


def unknown_dialog_bye() -> str:
    return scenario("unknown dialog", """  <send retrans="500">
    <![CDATA[
      BYE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      """ + FROM + """
      To: <sip:agent@[remote_ip]:[remote_port]>;tag=nosuchdialog
      Call-ID: [call_id]
      CSeq: 7 BYE
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="481"/>
""")


def rejected(status: int, timeout_ms: int = 15000) -> str:
    """Call and expect a final failure `status` (the application's reject, or the 480 of
    an unanswered call); ACK it on the INVITE's branch."""
    branch = "z9hG4bK-[pid]-[call_number]-invite"
    body = (invite(branch=branch)
            + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="180"/>\n'
            + f'  <recv response="{status}" timeout="{timeout_ms}"/>\n'
            + ack_non_2xx(branch)
            + '  <pause milliseconds="300"/>\n')
    return scenario(f"rejected {status}", body)
