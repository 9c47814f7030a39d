"""Mimi architecture facts and config parsing."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from agent.plugins.personaplex.mimi_config import (
    STANDARD_MIMI,
    MimiConfigError,
    build_mimi,
    parse_mimi_config,
    read_mimi_config,
    standard_mimi_config,
)
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model

loaders = require_oracle("moshi.models.loaders")


def test_standard_config_is_the_reference_one() -> None:
    assert STANDARD_MIMI == loaders._mimi_config
    config = standard_mimi_config()
    assert config.frame_size == 1920
    assert parse_mimi_config(None) == config


def test_standard_mimi_has_the_reference_key_layout() -> None:
    # On the meta device: shapes and names only, no 79 M parameters allocated.
    with torch.device("meta"):
        ours = build_mimi(None, "meta", torch.float32)
        reference = loaders.get_mimi(None, None, device="meta")
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ref_shapes = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert ours_shapes == ref_shapes
    assert ours.total_codebooks == 32
    assert ours.frame_size == 1920
    assert sum(p.numel() for p in ours.parameters()) == sum(
        p.numel() for p in reference.parameters()
    )


def test_mimi_json_file_round_trips(tmp_path) -> None:
    path = tmp_path / "mimi.json"
    path.write_text(json.dumps(STANDARD_MIMI))
    assert read_mimi_config(path) == standard_mimi_config()
    assert read_mimi_config(path).to_dict() == STANDARD_MIMI


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda c: c.pop("seanet"), "missing 'seanet'"),
        (lambda c: c.__setitem__("frame_rate", 0), "frame_rate"),
        (lambda c: c.__setitem__("frame_rate", 7.0), "not whole"),
        (lambda c: c.__setitem__("quantizer", []), "must be an object"),
        (lambda c: c["seanet"].__setitem__("causal", False), "causal"),
        (lambda c: c["seanet"].__setitem__("pad_mode", "reflect"), "pad_mode"),
        (lambda c: c["seanet"].__setitem__("activation", "NoSuchThing"), "activation"),
        (lambda c: c["seanet"].__setitem__("ratios", [8, 6, 5, 3]), "multiple of the SEANet hop"),
        (lambda c: c["quantizer"].__setitem__("n_q", 1), "n_q"),
        (lambda c: c["quantizer"].__setitem__("bogus", 1), "bogus"),
        (lambda c: c["transformer"].__setitem__("norm", "batch_norm"), "norm"),
    ],
)
def test_unservable_configs_get_clear_errors(mutate, match) -> None:
    config = copy.deepcopy(STANDARD_MIMI)
    mutate(config)
    with pytest.raises(MimiConfigError, match=match):
        with torch.device("meta"):
            build_mimi(config, "meta", torch.float32)


def test_unreadable_json_is_a_config_error(tmp_path) -> None:
    path = tmp_path / "mimi.json"
    path.write_text("{not json")
    with pytest.raises(MimiConfigError, match="cannot read"):
        read_mimi_config(path)
    with pytest.raises(MimiConfigError, match="JSON object"):
        parse_mimi_config([1, 2])  # type: ignore[arg-type]
