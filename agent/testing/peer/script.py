"""A scripted test conversation: read from YAML or JSON, checked against its JSON Schema
(`script_schema.json`, with the `jsonschema` package), and prepared before any call is
placed: every WAV read and every `say` text spoken by espeak-ng up front, so a typo or a
missing file costs no call. PyYAML, jsonschema and the speech detector come with the
peer extra (extra.py), imported only when a script is read.

Errors are `CliError`s with a code and one line naming the file and the step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from agent.cli_errors import CliError
from agent.testing.peer import extra
from agent.testing.peer.recording import PEER_RATE
from agent.testing.peer.wav import load_wav, read_audio_file

STEP_NAMES = ("play", "say", "expect_speech", "barge_in", "dtmf", "session_update",
              "expect_event", "expect_transcript", "silence", "hangup", "expect_hangup")
BARE_STEPS = ("hangup", "expect_speech", "expect_hangup")
ESPEAK_SECONDS = 30  # a generous bound on synthesising one line of text


@dataclass
class Step:
    index: int  # 1-based, as a person counts the script's steps
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    audio: np.ndarray | None = None  # play/say/barge_in: the caller's audio at PEER_RATE

    @property
    def label(self) -> str:
        return f"{self.index:02d}_{self.kind}"


@dataclass
class Script:
    name: str
    steps: list[Step]
    transport: str | None = None
    session: dict[str, Any] | None = None
    path: str | None = None


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    text = resources.files("agent.testing.peer").joinpath("script_schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def parse_text(text: str, where: str) -> Any:
    """JSON, or else YAML (a superset of JSON) -> plain data."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML or JSON"
        raise CliError("invalid_script", f"{where}: {problem}{at}") from None


def _step_name(raw: Any) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and len(raw) == 1:
        return str(next(iter(raw)))
    return None


def validate(data: Any, where: str) -> None:
    """Unknown step names first (the clearest message), then the schema."""
    steps = data.get("steps") if isinstance(data, dict) else data
    if isinstance(steps, list):
        for number, raw in enumerate(steps, start=1):
            name = _step_name(raw)
            if name is None:
                raise CliError("invalid_script", f"{where}: step {number}: a step is one name "
                               "with its argument, e.g. `play: hello.wav`")
            if name not in STEP_NAMES:
                raise CliError("unknown_step", f"{where}: step {number}: unknown step "
                               f"{name!r} (known: {', '.join(STEP_NAMES)})")
            if isinstance(raw, str) and name not in BARE_STEPS:
                raise CliError("invalid_script", f"{where}: step {number}: {name} needs an "
                               "argument")
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    path = list(error.absolute_path)
    if path[:1] == ["steps"] and len(path) > 1:
        path = path[1:]
    place = ""
    if path and isinstance(path[0], int):
        place = f" step {path[0] + 1}"
        rest = [str(p) for p in path[1:]]
        if rest:
            place += f" ({'.'.join(rest)})"
    elif path:
        place = f" {'.'.join(str(p) for p in path)}"
    raise CliError("invalid_script", f"{where}:{place} {error.message}" if not place else
                   f"{where}:{place}: {error.message}")


def read_audio(path: str, where: str) -> np.ndarray:
    return read_audio_file(path, f"{where}: {path}", "wav")


def speak(text: str, where: str, rate: int = PEER_RATE) -> np.ndarray:
    """`text` spoken by espeak-ng, as float32 mono at `rate`."""
    program = shutil.which("espeak-ng")
    if program is None:
        raise CliError("espeak_missing", f"{where}: `say` needs espeak-ng, which is not "
                       "installed (apt-get install espeak-ng), or use `play: FILE.wav`")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "say.wav")
        try:
            done = subprocess.run([program, "-w", out, "--", text], capture_output=True,
                                  timeout=ESPEAK_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise CliError("espeak_failed", f"{where}: espeak-ng took over "
                           f"{ESPEAK_SECONDS} s") from None
        if done.returncode != 0 or not os.path.exists(out):
            reason = done.stderr.decode(errors="replace").strip().splitlines()
            raise CliError("espeak_failed", f"{where}: espeak-ng failed"
                           + (f": {reason[-1]}" if reason else ""))
        return load_wav(out, rate)


def _audio_of(args: dict[str, Any], folder: str, where: str) -> np.ndarray:
    if "play" in args:
        path = str(args["play"])
        return read_audio(path if os.path.isabs(path) else os.path.join(folder, path), where)
    return speak(str(args["say"]), where)


def build(data: Any, where: str, folder: str) -> Script:
    """Validated script data → steps with their audio ready."""
    extra.require("--script")
    validate(data, where)
    settings: dict[str, Any] = data if isinstance(data, dict) else {}
    raw_steps = settings.get("steps", data)
    steps: list[Step] = []
    for number, raw in enumerate(raw_steps, start=1):
        kind = _step_name(raw)
        assert kind is not None  # validate() let only one-name steps through
        value = None if isinstance(raw, str) else raw[kind]
        args: dict[str, Any]
        if kind in ("play", "say"):
            args = {kind: value}
        elif isinstance(value, dict):
            args = dict(value)
        elif value is None:
            args = {}
        else:
            args = {"value": value}
        step = Step(number, kind, args)
        here = f"{where}: step {number} ({kind})"
        if kind in ("play", "say", "barge_in"):
            step.audio = _audio_of(args, folder, here)
        steps.append(step)
    name = settings.get("name") or os.path.splitext(os.path.basename(where))[0] or "script"
    return Script(name=str(name), steps=steps, transport=settings.get("transport"),
                  session=settings.get("session"))


def load(path: str) -> Script:
    """Read, validate and prepare the script at `path`."""
    extra.require("--script")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise CliError("script_not_found", f"--script {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not a readable text file"
        raise CliError("script_unreadable", f"--script {path}: {reason}") from None
    data = parse_text(text, path)
    script = build(data, path, os.path.dirname(os.path.abspath(path)))
    script.path = path
    return script
