"""Session policy for the PersonaPlex / Moshi plugins: what a client may ask for.

Pure functions only (no model, no files), so every refusal has a coded error and a unit test.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agent.plugins.base import PluginError
from agent.plugins.moshi_defaults import DEFAULT_PERSONA

SYSTEM_TAG = "<system>"
MAX_PERSONA_CHARS = 4000

# Set by the server only (runtime plumbing); a client sending any of these is refused.
PRIVATE_EXTRA_BODY_KEYS: frozenset[str] = frozenset(
    {"model_dir", "device", "dtype", "voice_path", "voice_prompt", "slot", "max_sessions",
     "prompt_snapshot"}
)
# What a client may tune per session.
CLIENT_EXTRA_BODY_KEYS: frozenset[str] = frozenset(
    {"sampling", "seed", "temperature", "temperature_text", "top_k", "top_k_text"}
)

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TEMPERATURE_TEXT = 0.7
DEFAULT_TOP_K = 250
DEFAULT_TOP_K_TEXT = 25
MAX_SEED = 2**63 - 1
# `extra_body.sampling` (and the server's `--sampling`): a bool, or a named preset. `reference`
# is NVIDIA's server default (sampling on, the temperatures and top-k above, as its LMGen).
SAMPLING_PRESETS = {"greedy": False, "reference": True}

# A voice is a bare file name: letters, digits, '_', '-', '.', ending in .pt (stored prompt
# embeddings) or .wav (a recording, encoded at first use), no leading dot.
_VOICE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*\.(pt|wav)$")
VOICE_KINDS = {".pt": "embeddings", ".wav": "recording"}


def uploaded_voice_name(data: bytes) -> str:
    """The voice name of an uploaded recording: its content hash, so one recording uploaded
    by many calls is encoded and prefilled once (and a client can't name another's)."""
    return f"upload-{hashlib.blake2b(data, digest_size=12).hexdigest()}.wav"


def voice_kind(name: str) -> str:
    """What a voice file holds: "embeddings" (.pt) or "recording" (.wav)."""
    return VOICE_KINDS[name[name.rfind("."):]]


def validate_voice(name: str | None, available: Collection[str], default: str) -> str:
    """The voice file to use; a bare bundled `.pt` or `.wav` basename, or `invalid_voice`."""
    if name is None or name == "":
        name = default
    if (
        not isinstance(name, str)
        or "/" in name
        or "\\" in name
        or ".." in name
        or "\x00" in name
        or not _VOICE_NAME.match(name)
    ):
        raise PluginError(
            "invalid_voice",
            "voice must be the file name of a bundled voice prompt such as 'NATF2.pt' or "
            "'custom.wav' "
            "(no paths)",
            param="session.voice",
        )
    if name not in available:
        listed = ", ".join(sorted(available)) or "none"
        raise PluginError(
            "invalid_voice", f"unknown voice '{name}'; available: {listed}",
            param="session.voice",
        )
    return name


def persona_instructions(instructions: str | None) -> str:
    """The persona text a session runs with (the default when none or blank was given)."""
    if instructions is None or not instructions.strip():
        return DEFAULT_PERSONA
    if len(instructions) > MAX_PERSONA_CHARS:
        raise PluginError(
            "invalid_instructions",
            f"instructions are limited to {MAX_PERSONA_CHARS} characters",
            param="session.instructions",
        )
    return instructions.strip()


def wrap_persona(text: str) -> str:
    """The persona as the model was trained to see it on the text row. A persona already
    wrapped in the tags is left as it is, as NVIDIA's `wrap_with_system_tags` does."""
    stripped = text.strip()
    if stripped.startswith(SYSTEM_TAG) and stripped.endswith(SYSTEM_TAG):
        return stripped
    return f"{SYSTEM_TAG} {stripped} {SYSTEM_TAG}"


@dataclass(frozen=True)
class SamplingOptions:
    """How tokens are chosen: greedy (argmax) unless `use_sampling`."""

    use_sampling: bool = False
    temperature: float = DEFAULT_TEMPERATURE
    temperature_text: float = DEFAULT_TEMPERATURE_TEXT
    top_k: int = DEFAULT_TOP_K
    top_k_text: int = DEFAULT_TOP_K_TEXT
    seed: int | None = None


def _option_error(key: str, message: str) -> PluginError:
    return PluginError("invalid_option", f"extra_body.{key} {message}", param=f"extra_body.{key}")


def _float_option(
    extra_body: Mapping[str, Any], key: str, default: float, low: float, high: float
) -> float:
    value = extra_body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _option_error(key, "must be a number")
    if not low < value <= high:
        raise _option_error(key, f"must be greater than {low} and at most {high}")
    return float(value)


def _int_option(
    extra_body: Mapping[str, Any], key: str, default: int | None, low: int, high: int
) -> int | None:
    value = extra_body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _option_error(key, "must be an integer")
    if not low <= value <= high:
        raise _option_error(key, f"must be between {low} and {high}")
    return value


def sampling_choice(value: Any) -> bool:
    """`sampling` as given: true/false or a preset name ("greedy", "reference")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in SAMPLING_PRESETS:
        return SAMPLING_PRESETS[value]
    raise _option_error("sampling", "must be true, false, \"greedy\" or \"reference\"")


def sampling_options(extra_body: Mapping[str, Any], card: int, text_card: int,
                     default: str = "greedy") -> SamplingOptions:
    """Validated decoding options. Sampling settings without `sampling: true` are refused so a
    client never believes it is sampling while it gets greedy output. `default` is the
    server's preset, used when the call does not choose."""
    use_sampling = sampling_choice(extra_body.get("sampling", default))
    tuned = [k for k in ("temperature", "temperature_text", "top_k", "top_k_text", "seed")
             if k in extra_body]
    if tuned and not use_sampling:
        raise _option_error(tuned[0], "needs extra_body.sampling = true")
    top_k = _int_option(extra_body, "top_k", min(DEFAULT_TOP_K, card), 1, card)
    top_k_text = _int_option(extra_body, "top_k_text", min(DEFAULT_TOP_K_TEXT, text_card), 1,
                             text_card)
    assert top_k is not None and top_k_text is not None
    return SamplingOptions(
        use_sampling=use_sampling,
        temperature=_float_option(extra_body, "temperature", DEFAULT_TEMPERATURE, 0.0, 10.0),
        temperature_text=_float_option(
            extra_body, "temperature_text", DEFAULT_TEMPERATURE_TEXT, 0.0, 10.0
        ),
        top_k=top_k,
        top_k_text=top_k_text,
        seed=_int_option(extra_body, "seed", None, 0, MAX_SEED),
    )


def voice_update_unsupported(plugin_id: str) -> PluginError:
    return PluginError(
        "voice_update_unsupported",
        f"plugin '{plugin_id}' fixes the voice when the call opens; it cannot change mid-call",
        param="session.voice",
    )


def persona_update_unsupported(plugin_id: str) -> PluginError:
    return PluginError(
        "persona_update_unsupported",
        f"plugin '{plugin_id}' fixes the persona when the call opens; it cannot change mid-call",
        param="session.instructions",
    )
