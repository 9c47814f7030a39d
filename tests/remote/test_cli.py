"""The CLI builds the remote plugins from --upstream / --upstream-capacity / --model and the
upstream timeouts."""

from __future__ import annotations

import pytest

from agent.plugins.base import PluginError
from agent.plugins.registry import load_plugin
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from agent.plugins.remote.vllm_omni import VllmOmniPlugin
from signaling.__main__ import build_parser, main, plugin_options_from_args


def plugin_from(argv: list[str]):
    args = build_parser().parse_args(argv)
    return load_plugin(args.plugin, plugin_options_from_args(args))


def test_vllm_omni_from_flags() -> None:
    plugin = plugin_from([
        "--plugin", "vllm-omni", "--upstream", "ws://a:8000/v1/realtime?duplex=1",
        "--upstream", "ws://b:8000/v1/realtime?duplex=1", "--upstream-capacity", "8",
        "--model", "personaplex", "--voice", "NATF2.pt",
    ])
    assert isinstance(plugin, VllmOmniPlugin)
    assert [u["url"] for u in plugin.health()["upstreams"]] == [
        "ws://a:8000/v1/realtime?duplex=1", "ws://b:8000/v1/realtime?duplex=1"]
    assert plugin.capabilities().max_sessions == 16
    assert plugin.model == "personaplex" and plugin.capabilities().default_voice == "NATF2.pt"
    assert (plugin.settings.handshake_timeout, plugin.settings.stall_timeout) == (20.0, 5.0)


def test_upstream_timeouts_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = plugin_from(["--plugin", "moshi-server", "--upstream", "ws://a:8998/api/chat",
                          "--upstream-handshake-timeout", "45", "--upstream-stall-timeout", "2.5"])
    assert (plugin.settings.handshake_timeout, plugin.settings.stall_timeout) == (45.0, 2.5)
    with pytest.raises(SystemExit) as stopped:  # one coded line, exit status 2
        main(["--plugin", "vllm-omni", "--upstream", "ws://a/v1/realtime",
              "--upstream-stall-timeout", "0"])
    assert stopped.value.code == 2
    assert "invalid_option" in capsys.readouterr().err


def test_moshi_server_defaults_to_one_call_per_upstream() -> None:
    plugin = plugin_from(["--plugin", "moshi-server", "--upstream", "ws://a:8998/api/chat",
                          "--upstream", "ws://b:8998/api/chat"])
    assert isinstance(plugin, MoshiServerPlugin)
    assert plugin.capabilities().max_sessions == 2
    unlimited = plugin_from(["--plugin", "vllm-omni", "--upstream", "ws://a/v1/realtime"])
    assert unlimited.capabilities().max_sessions == 0


def test_a_remote_plugin_without_upstream_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PluginError) as refused:
        plugin_from(["--plugin", "vllm-omni"])
    assert refused.value.code == "no_upstream"
    with pytest.raises(SystemExit) as stopped:
        main(["--plugin", "moshi-server"])
    assert stopped.value.code == 2
    assert "no_upstream" in capsys.readouterr().err
