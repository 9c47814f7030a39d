from __future__ import annotations

from agent.telephony.telephone_event import (
    TelephoneEvent,
    TelephoneEventDetector,
    parse_telephone_event,
    telephone_event_payload,
)


def test_telephone_event_detector_reports_each_press_once() -> None:
    detector = TelephoneEventDetector()
    seen = [detector.feed(ts, telephone_event_payload(d, end=end, duration=dur))
            for ts, d, end, dur in [(100, "5", False, 160), (100, "5", False, 320),
                                    (100, "5", True, 480), (100, "5", True, 480),
                                    (900, "*", True, 160), (100, "5", True, 480),
                                    (1700, "D", False, 160)]]
    assert seen == ["5", None, None, None, "*", None, "D"]
    assert detector.feed(2000, b"\x01\x00") is None  # too short
    assert detector.feed(2100, bytes([20, 0x80, 0, 160])) is None  # not a keypad event
    assert detector.ignored == 2
    event = parse_telephone_event(telephone_event_payload("#", end=True, duration=1234, volume=7))
    assert event == TelephoneEvent(digit="#", end=True, volume=7, duration=1234)
