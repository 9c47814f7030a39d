"""Wideband codecs on SIP legs: G.722 (FFmpeg's, through PyAV; its RTP clock at 8000 by RFC
3551's rule) and L16/16000, chosen over G.711 whenever offered; a call in each, its echo
decoded and correlated with what was sent. (baresip, with its own G.722, in
test_sip_baresip.py.)"""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest
from aiortc.rtp import RtpPacket

from agent.telephony.codec import G722, L16_16K, PCMA, PCMU, NarrowbandCodec
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.sip.sdp import (
    AudioChoice,
    SdpError,
    SessionDescription,
    build_answer,
    choose_audio,
    parse_sdp,
)
from tests.sip.helpers import RtpProbe, SipPeer, SipServer, establish, hang_up


def test_g722_codes_16_khz_audio_in_160_bytes_a_packet_with_its_own_state_per_leg() -> None:
    encoder, decoder = G722.for_leg(), G722.for_leg()
    assert encoder is not decoder and encoder.new_state is None
    with pytest.raises(RuntimeError):
        G722.encode(np.zeros(320, dtype=np.int16))  # the template has no state to code with
    signal = make_test_signal(2.0, 16000)
    samples = (signal * 32767).astype(np.int16)
    payloads = [encoder.encode(samples[i:i + 320]) for i in range(0, len(samples), 320)]
    assert {len(payload) for payload in payloads} == {160}
    assert (G722.samples_in(payloads[0]), G722.rtp_samples_per_chunk) == (320, 160)
    assert (G722.encoding, G722.rtp_clock, G722.sample_rate) == ("G722", 8000, 16000)
    decoded = np.concatenate([decoder.decode(payload) for payload in payloads])
    echo = measure_echo(signal, decoded.astype(np.float32) / 32768, 16000)
    assert echo.correlation >= 0.95, echo
    assert decoder.decode(b"").size == 0 and decoder.decode(b"\x00").size == 2


def offer(*media: str) -> SessionDescription:
    text = "\r\n".join(["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1",
                        "t=0 0", *media, ""])
    parsed = parse_sdp(text.encode())
    assert isinstance(parsed, SessionDescription)
    return parsed


EVENTS_8K = "a=rtpmap:101 telephone-event/8000"


@pytest.mark.parametrize("media, codec, payload_type, dtmf", [
    (("m=audio 4000 RTP/AVP 0 9 101", EVENTS_8K), G722, 9, 101),  # preferred when offered
    (("m=audio 4000 RTP/AVP 9 0", "a=rtpmap:9 G722/8000"), G722, 9, None),
    (("m=audio 4000 RTP/AVP 8 0",), PCMA, 8, None),  # G.711: the offerer's order
    (("m=audio 4000 RTP/AVP 0 96 97 101", "a=rtpmap:96 L16/16000", EVENTS_8K,
      "a=rtpmap:97 telephone-event/16000"), L16_16K, 96, 97),  # events on L16's own clock
    (("m=audio 4000 RTP/AVP 96 9", "a=rtpmap:96 L16/16000"), G722, 9, None),
    (("m=audio 4000 RTP/AVP 9 0", "a=rtpmap:9 G722/16000"), PCMU, 0, None),  # not RFC 3551
    (("m=audio 4000 RTP/AVP 96 97 0", "a=rtpmap:96 L16/16000/2", "a=rtpmap:97 L16/16000/1"),
     L16_16K, 97, None),  # stereo is not taken, mono (said or not) is
])
def test_wideband_is_chosen_whenever_offered(media: tuple[str, ...], codec: NarrowbandCodec,
                                             payload_type: int, dtmf: int | None) -> None:
    choice = choose_audio(offer(*media))
    assert isinstance(choice, AudioChoice), choice
    assert (choice.codec, choice.payload_type, choice.dtmf_payload_type) == (
        codec, payload_type, dtmf)
    answer = build_answer(offer(*media), choice, "127.0.0.1", 5000, 1, 1).decode()
    assert f"a=rtpmap:{payload_type} {codec.encoding}/{codec.rtp_clock}\r\n" in answer
    pinned = choose_audio(offer(*media), ("PCMU", "PCMA"))  # the old set: never wideband
    assert isinstance(pinned, SdpError) or pinned.codec in (PCMU, PCMA)


def stream(source: socket.socket, to: tuple[str, int], codec: NarrowbandCodec,
           payload_type: int, samples: np.ndarray) -> None:
    """Send `samples` as 20 ms RTP packets on the wall clock, the way a phone would: from a
    thread of its own, so the server's event loop (this process's) cannot make it late."""
    coder = codec.for_leg()
    step, clock_step = codec.samples_per_chunk, codec.rtp_samples_per_chunk
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(samples) - step + 1, step)):
        packet = RtpPacket(payload_type=payload_type, sequence_number=index,
                           timestamp=index * clock_step, ssrc=4242,
                           payload=coder.encode(samples[offset:offset + step]))
        source.sendto(packet.serialize(), to)
        time.sleep(max(0.0, start + (index + 1) * 0.02 - time.monotonic()))


def in_order(probe: RtpProbe, payload_type: int) -> list[RtpPacket]:
    """The agent's packets of this type by sequence number (from a random start, may wrap)."""
    packets = [p for p in probe.packets if p.payload_type == payload_type]
    first = packets[0].sequence_number if packets else 0
    return sorted(packets, key=lambda p: (p.sequence_number - first) & 0xFFFF)


def heard(probe: RtpProbe, codec: NarrowbandCodec, payload_type: int) -> np.ndarray:
    packets = in_order(probe, payload_type)
    decoder = codec.for_leg()
    return np.concatenate([decoder.decode(p.payload) for p in packets]).astype(
        np.float32) / 32768


@pytest.mark.slow
@pytest.mark.parametrize("formats, extra, codec, payload_type", [
    ("0 9 101", [], G722, 9),
    ("0 96 101", ["a=rtpmap:96 L16/16000"], L16_16K, 96),
])
async def test_a_wideband_call_echoes_16_khz_audio(
    sip_server: SipServer, formats: str, extra: list[str], codec: NarrowbandCodec,
    payload_type: int,
) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    body = "\r\n".join(["v=0", "o=peer 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1",
                        "t=0 0", f"m=audio {probe.port} RTP/AVP {formats}", *extra,
                        "a=rtpmap:101 telephone-event/8000", ""]).encode()
    dialogue, _, ok = await establish(sip_server, peer, body)
    answer = parse_sdp(ok.body)
    assert isinstance(answer, SessionDescription)
    media = answer.media[0]
    assert media.formats[0] == str(payload_type)
    assert media.rtpmap[payload_type] == (codec.encoding, codec.rtp_clock)
    signal = make_test_signal(3.0, 16000)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:  # the offer's IP
        await asyncio.to_thread(stream, sender, ("127.0.0.1", media.port), codec,
                                payload_type, (signal * 32767).astype(np.int16))
    await asyncio.sleep(0.5)  # the echo's tail
    (leg,) = list(sip_server.agent.legs)
    assert leg.stats()["codec"] == codec.name
    ours = in_order(probe, payload_type)
    steps = {(b.timestamp - a.timestamp) & 0xFFFFFFFF
             for a, b in zip(ours, ours[1:], strict=False)}
    assert steps == {codec.rtp_samples_per_chunk}  # G.722: 160 a packet, not 320
    assert {len(p.payload) for p in ours} == {  # G.722: 160 bytes, L16: 640
        codec.samples_per_chunk * codec.bytes_per_sample // codec.samples_per_byte}
    # As long as what was sent: past its end the echo is silence, which no window can match.
    echo = measure_echo(signal, heard(probe, codec, payload_type)[:len(signal)], 16000)
    print(f"\n{codec.name} echo over SIP: correlation {echo.correlation:.3f}, "
          f"lag {echo.lag_seconds:.3f} s")
    assert echo.correlation >= 0.85, echo  # 0.92-1.0 measured; a loaded machine costs some
    await hang_up(sip_server, peer, dialogue, probe)
