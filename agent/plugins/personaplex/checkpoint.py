"""Checkpoint directory checks: every file a release needs, with a clear coded error for each
thing that is missing, before any weights are read."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors
import torch

from agent.plugins.base import PluginError

CONFIG_NAME = "config.json"
DEFAULT_LM_NAME = "model.safetensors"
DEFAULT_MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
DEFAULT_TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
VOICES_DIR = "voices"
VOICES_ARCHIVE = "voices.tgz"


def model_dir_error(message: str) -> PluginError:
    return PluginError("model_dir_invalid", message, param="model_dir", status=500)


def unsupported_error(message: str) -> PluginError:
    return PluginError("model_config_unsupported", message, param="model_dir", status=500)


@dataclass
class CheckpointFiles:
    model_dir: Path
    config: dict[str, Any]
    lm_weights: Path
    mimi_weights: Path
    tokenizer: Path
    voices: dict[str, Path | bytes] = field(default_factory=dict)

    @property
    def voice_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.voices))

    def load_voice(self, name: str, device: torch.device) -> dict[str, torch.Tensor]:
        """A voice prompt `{"embeddings": [T,1,1,dim], "cache": [1,K,C]}` on `device`."""
        source = self.voices[name]
        handle: Any = io.BytesIO(source) if isinstance(source, bytes) else source
        try:
            prompt = torch.load(handle, map_location=device, weights_only=True)
        except Exception as exc:  # a corrupt file must not take the server down
            raise model_dir_error(f"voice prompt {name} cannot be read: {exc}") from exc
        if (
            not isinstance(prompt, dict)
            or not isinstance(prompt.get("embeddings"), torch.Tensor)
            or not isinstance(prompt.get("cache"), torch.Tensor)
        ):
            raise model_dir_error(f"voice prompt {name} lacks 'embeddings' and 'cache' tensors")
        return prompt


def _local_name(config: dict[str, Any], key: str, default: str) -> str:
    name = config.get(key, default)
    if not isinstance(name, str) or not name:
        raise model_dir_error(f"config.json: '{key}' must be a file name")
    if name.startswith("file://"):
        name = name.removeprefix("file://")
    if name.startswith("hf://"):
        raise model_dir_error(
            f"config.json: '{key}' points at the hub ({name}); download it into the model dir"
        )
    return name


def _required_file(model_dir: Path, name: str, what: str, problems: list[str]) -> Path:
    """The file's path; a missing file, or weights whose header cannot be read, is noted."""
    path = model_dir / name
    if not path.is_file():
        problems.append(f"{model_dir} has no {what} file '{name}'")
    elif name.endswith(".safetensors"):
        try:
            with safetensors.safe_open(str(path), framework="pt") as weights:
                weights.keys()
        except Exception as exc:  # safetensors raises its own error types for bad headers
            problems.append(f"{path} ({what}) is not a readable safetensors file: "
                            f"{str(exc)[:200]}")
    return path


def _voices(model_dir: Path) -> dict[str, Path | bytes]:
    voices: dict[str, Path | bytes] = {}
    folder = model_dir / VOICES_DIR
    if folder.is_dir():
        voices.update({p.name: p for pattern in ("*.pt", "*.wav") for p in folder.glob(pattern)
                       if p.is_file() and not p.name.startswith(".")})
    archive = model_dir / VOICES_ARCHIVE
    if not voices and archive.is_file():
        try:
            with tarfile.open(archive, "r:*") as tar:
                for member in tar.getmembers():
                    name = Path(member.name).name
                    if member.isfile() and name.endswith(".pt") and not name.startswith("."):
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            voices[name] = extracted.read()
        except (tarfile.TarError, OSError) as exc:
            raise model_dir_error(f"{archive} cannot be read: {exc}") from exc
    return voices


def inspect_checkpoint(model_dir: str | Path | None, *, need_voices: bool) -> CheckpointFiles:
    """Check the directory's layout; raise `model_dir_invalid` naming what is missing."""
    if not model_dir:
        raise model_dir_error("a model directory is required (--model-dir DIR)")
    root = Path(model_dir).expanduser()
    if not root.is_dir():
        raise model_dir_error(f"model directory {root} does not exist")
    config_path = root / CONFIG_NAME
    if not config_path.is_file():
        raise model_dir_error(f"{root} has no {CONFIG_NAME}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise model_dir_error(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise model_dir_error(f"{config_path} must hold a JSON object")
    # Every missing or unreadable file is named at once, one line each: a user copying a
    # release by hand fixes them in one go instead of one per start-up.
    problems: list[str] = []
    lm_weights = _required_file(root, _local_name(config, "moshi_name", DEFAULT_LM_NAME),
                                "LM weights", problems)
    mimi_weights = _required_file(root, _local_name(config, "mimi_name", DEFAULT_MIMI_NAME),
                                  "Mimi weights", problems)
    tokenizer = _required_file(
        root, _local_name(config, "tokenizer_name", DEFAULT_TOKENIZER_NAME), "tokenizer", problems
    )
    if "mimi_config_name" in config:
        _required_file(root, _local_name(config, "mimi_config_name", ""), "Mimi config", problems)
    try:
        voices = _voices(root)
    except PluginError as exc:
        problems.append(exc.message)
        voices = {}
    else:
        if need_voices and not voices:
            problems.append(f"{root} has no voice prompts ({VOICES_DIR}/*.pt or {VOICES_ARCHIVE})")
    if problems:
        raise model_dir_error("\n".join(problems))
    files = CheckpointFiles(model_dir=root, config=config, lm_weights=lm_weights,
                            mimi_weights=mimi_weights, tokenizer=tokenizer, voices=voices)
    return files


def check_layout(config: dict[str, Any], dep_q: int, plugin_id: str) -> None:
    """Refuse a config this plugin's layout cannot serve."""
    n_q = config.get("n_q", 16)
    actual_dep_q = config.get("dep_q", 8)
    if n_q != 16:
        raise unsupported_error(f"n_q={n_q}: plugin '{plugin_id}' serves 8 agent + 8 user streams")
    if actual_dep_q != dep_q:
        other = "personaplex" if actual_dep_q == 16 else "moshi"
        raise unsupported_error(
            f"this checkpoint has dep_q={actual_dep_q}; plugin '{plugin_id}' needs dep_q={dep_q}"
            f" (try --plugin {other})"
        )
    delays = config.get("delays")
    if delays is not None and len(delays) != n_q + 1:
        raise unsupported_error(f"delays {delays} must have one entry per token row ({n_q + 1})")
