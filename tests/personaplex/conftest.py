"""Shared fixtures: tiny random-weight checkpoints in the release layout (written once per run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PersonaPlex-layout (dep_q 16) checkpoint directory."""
    torch.set_num_threads(1)
    return write_checkpoint(
        tmp_path_factory.mktemp("tiny_personaplex"), "tiny", "personaplex", seed=0
    )


@pytest.fixture(scope="session")
def tiny_moshi_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Moshi-layout (dep_q 8) checkpoint directory."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny_moshi"), "tiny", "moshi", seed=1)
