"""A plugin declares its own command-line flags; signaling adds them for the selected plugin
only and hands their values to `from_options`."""

from __future__ import annotations

from typing import ClassVar

import pytest

from agent.plugins import registry
from agent.plugins.base import PluginFlag, PluginOptions
from agent.plugins.echo import EchoPlugin
from signaling.__main__ import build_parser, plugin_options_from_args


class GreeterPlugin(EchoPlugin):
    """A third-party plugin: nothing in signaling/ knows its flags."""

    id = "greeter"
    flags: ClassVar[tuple[PluginFlag, ...]] = (
        PluginFlag("--greeting", "what the greeter says first", default="hello"),
        PluginFlag("--greeting-repeats", "how often", default=1, type=int, metavar="N"),
    )
    seen: ClassVar[PluginOptions | None] = None

    @classmethod
    def from_options(cls, options: PluginOptions) -> EchoPlugin:
        cls.seen = options
        return super().from_options(options)


@pytest.fixture
def greeter_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BUILTIN_PLUGINS, "greeter", f"{__name__}:GreeterPlugin")


def test_a_plugins_flags_reach_it(greeter_installed: None) -> None:
    args = build_parser().parse_args(["--plugin", "greeter", "--greeting", "hi",
                                      "--greeting-repeats", "3"])
    registry.load_plugin(args.plugin, plugin_options_from_args(args))
    assert GreeterPlugin.seen is not None
    assert dict(GreeterPlugin.seen.extra) == {"greeting": "hi", "greeting_repeats": 3}
    defaults = plugin_options_from_args(build_parser().parse_args(["--plugin", "greeter"]))
    assert dict(defaults.extra) == {"greeting": "hello", "greeting_repeats": 1}


def test_another_plugins_flag_is_refused(greeter_installed: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--greeting", "hi"])  # echo, the default, has no such flag
    assert stopped.value.code == 2
    assert "--greeting" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--plugin", "greeter", "--greeting-repeats", "many"])


def test_help_lists_the_selected_plugins_flags(greeter_installed: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--plugin", "greeter", "--help"])
    text = capsys.readouterr().out
    assert "options of the greeter plugin" in text and "--greeting-repeats N" in text


def test_built_in_plugins_declare_theirs() -> None:
    args = build_parser().parse_args(["--plugin", "moshi-server", "--upstream-kind", "kyutai",
                                      "--upstream-capacity", "2"])
    extra = plugin_options_from_args(args).extra
    assert extra["upstream_kind"] == "kyutai" and extra["upstream_capacity"] == 2
    assert extra["upstream_handshake_timeout"] == 20.0
