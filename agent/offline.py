"""Offline inference: run a speech-model plugin over a WAV file, frame by frame.

    python -m agent.offline --plugin personaplex|moshi --model-dir DIR --input in.wav \
        --output out.wav [--voice V] [--persona TEXT] [--text out.txt] [--tokens out.json] \
        [--device cpu|cuda] [--dtype float32|bfloat16] [--seed N] [--sample]

It drives the same plugin code the server does (one `step` per 80 ms frame), so the output WAV
has exactly one output frame per input frame; the last partial input frame is zero-padded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import wave
from pathlib import Path
from typing import Any

import av
import numpy as np

from agent.cli_errors import CliError, CliParser, exit_with_error
from agent.plugins.base import PluginError, PluginOptions, SessionConfig
from agent.plugins.registry import load_plugin


def read_audio(path: str | Path, sample_rate: int) -> np.ndarray:
    """Any file av can decode, as float32 mono at `sample_rate`."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
    chunks: list[np.ndarray] = []
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1))
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(chunks).astype(np.float32, copy=False)


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM mono WAV."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())


def split_frames(audio: np.ndarray, frame_size: int) -> list[np.ndarray]:
    count = -(-len(audio) // frame_size)
    padded = np.zeros(count * frame_size, dtype=np.float32)
    padded[: len(audio)] = audio
    return [padded[i * frame_size:(i + 1) * frame_size] for i in range(count)]


async def _open(args: argparse.Namespace) -> tuple[Any, Any]:
    plugin = load_plugin(
        args.plugin,
        PluginOptions(model_dir=args.model_dir, device=args.device, dtype=args.dtype,
                      max_sessions=1, voice=args.voice),
    )
    await plugin.start()
    extra_body: dict[str, Any] = {}
    if args.sample:
        extra_body["sampling"] = True
        if args.seed is not None:
            extra_body["seed"] = args.seed
    config = await plugin.prepare_runtime_config(
        SessionConfig(voice=args.voice, instructions=args.persona, extra_body=extra_body)
    )
    return plugin, config


def run(args: argparse.Namespace) -> dict[str, Any]:
    plugin, config = asyncio.run(_open(args))
    try:
        capabilities = plugin.capabilities()
        frames = split_frames(read_audio(args.input, capabilities.sample_rate),
                              capabilities.frame_size)
        session = plugin.create_session(config)
        outputs: list[np.ndarray] = []
        text_pieces: list[str] = []
        tokens: list[Any] = []
        for frame in frames:
            (output,) = plugin.step([(session, frame)])
            outputs.append(np.asarray(output.audio, dtype=np.float32).reshape(-1))
            text_pieces.append(output.text)
            tokens.append(dict(output.tokens) if output.tokens is not None else None)
        plugin.close_session(session)
    finally:
        asyncio.run(plugin.close())
    audio = np.concatenate(outputs) if outputs else np.zeros(0, dtype=np.float32)
    write_wav(args.output, audio, capabilities.sample_rate)
    text = "".join(text_pieces)
    if args.text:
        Path(args.text).write_text(text)
    if args.tokens:
        Path(args.tokens).write_text(json.dumps(
            {"frame_size": capabilities.frame_size, "sample_rate": capabilities.sample_rate,
             "frames": tokens}
        ))
    return {"frames": len(frames), "text": text}


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="python -m agent.offline",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--plugin", choices=("personaplex", "moshi"), default="personaplex")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--voice")
    parser.add_argument("--persona")
    parser.add_argument("--text", help="write the agent's transcript here")
    parser.add_argument("--tokens", help="write the text and audio token ids per frame (JSON)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="float32 (CPU default) or bfloat16 (CUDA default)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--sample", action="store_true",
                        help="sample (temperature/top-k) instead of greedy decoding")
    return parser


def check_output_path(path: str, flag: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError("output_unwritable", f"{flag} {path}: folder {folder} does not exist")
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise CliError("output_unwritable", f"{flag} {path}: cannot write there")


def check_input_path(path: str) -> None:
    if not os.path.exists(path):
        raise CliError("input_not_found", f"--input {path}: no such file")
    try:
        with av.open(path) as container:
            if not container.streams.audio:
                raise CliError("input_unreadable", f"--input {path}: the file has no audio")
    except (OSError, av.error.FFmpegError):
        raise CliError("input_unreadable", f"--input {path}: not a readable audio file") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seed is not None and not args.sample:
        parser.error("--seed only applies with --sample (greedy decoding has no randomness)")
    try:
        # Checked before the model loads, so a typo does not cost a model load.
        check_input_path(args.input)
        for flag, path in (("--output", args.output), ("--text", args.text),
                           ("--tokens", args.tokens)):
            if path:
                check_output_path(path, flag)
        summary = run(args)
    except CliError as exc:
        exit_with_error(exc.code, exc.message)
    except PluginError as exc:
        exit_with_error(exc.code, exc.message, cause=exc)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        exit_with_error("io_error", f"{exc.strerror or exc}{where}", cause=exc)
    except av.error.FFmpegError as exc:
        exit_with_error("audio_unreadable", "the audio could not be decoded", cause=exc)
    print(f"{summary['frames']} frames -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
