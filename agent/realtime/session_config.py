"""OpenAI-Realtime-shaped session objects → the plugin-neutral `SessionConfig`.

Clients written for the OpenAI Realtime API put the voice at `session.audio.output.voice`;
the agent's own flat shape (`voice`, `instructions`, `extra_body`) is accepted too. Fields
the agent knows are type-checked (a wrong type is a coded error naming the field); other
OpenAI fields (`tools`, `turn_detection`, ...) mean nothing to a full-duplex model and are
ignored, so existing clients keep working.
"""

from __future__ import annotations

from typing import Any

from agent.plugins.base import PluginError, SessionConfig


def _invalid(param: str, what: str) -> PluginError:
    return PluginError("invalid_type", f"'{param}' must be {what}", param=param)


def _object_or_none(obj: dict[str, Any], key: str, param: str) -> dict[str, Any] | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise _invalid(f"{param}.{key}", "an object")
    return value


def _string_or_none(obj: dict[str, Any], key: str, param: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid(f"{param}.{key}", "a string")
    return value


def session_config_from_realtime(obj: Any, *, param: str = "session") -> SessionConfig:
    """Validate the JSON shape of a session object; plugin policy is applied later."""
    if obj is None:
        return SessionConfig()
    if not isinstance(obj, dict):
        raise _invalid(param, "an object")
    session_type = obj.get("type")
    if session_type is not None and session_type != "realtime":
        raise PluginError("invalid_value", f"'{param}.type' must be \"realtime\"",
                          param=f"{param}.type")
    _string_or_none(obj, "model", param)
    voice = _string_or_none(obj, "voice", param)
    audio = _object_or_none(obj, "audio", param)
    if audio is not None:
        _object_or_none(audio, "input", f"{param}.audio")
        output = _object_or_none(audio, "output", f"{param}.audio")
        if output is not None:
            nested_voice = _string_or_none(output, "voice", f"{param}.audio.output")
            if nested_voice is not None:
                if voice is not None and voice != nested_voice:
                    raise PluginError(
                        "conflicting_values",
                        f"'{param}.voice' and '{param}.audio.output.voice' differ",
                        param=f"{param}.audio.output.voice",
                    )
                voice = nested_voice
    instructions = _string_or_none(obj, "instructions", param)
    extra_body = _object_or_none(obj, "extra_body", param) or {}
    return SessionConfig(voice=voice, instructions=instructions, extra_body=dict(extra_body))
