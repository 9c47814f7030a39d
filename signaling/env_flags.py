"""Every long flag can also come from the environment: `--rtc-ports 40000-40099` is
`AGENT_RTC_PORTS=40000-40099`.

Containers, Procfiles and Kubernetes set environment variables more easily than command
lines, and secrets (`--webhook-secret`, `--cluster-secret`, ...) belong there rather than in
`ps` output. The rule is one line: `AGENT_` + the flag's name in capitals with `-` as `_`.
A flag given on the command line wins over its variable. A repeatable flag
(`--rtc-advertise`, `--upstream`, ...) takes a comma-separated list; an on/off flag takes
1/true/yes/on or 0/false/no/off. Hidden flags (the supervisor's own `--worker-index`) are
never read from the environment.

argparse has no environment support of its own and the usual packages (ConfigArgParse)
would replace the parser the plugins add their flags to, so this is a small translation to
argv in front of the command line, which keeps argparse's own checks and messages.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from agent.errors import AgentError

PREFIX = "AGENT_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvFlagError(AgentError, ValueError):
    """A variable that names a flag but holds a value the flag cannot take."""

    def __init__(self, message: str) -> None:
        super().__init__("env_flag_invalid", message)


def variable_name(option: str) -> str:
    """`--rtc-ports` → `AGENT_RTC_PORTS`."""
    return PREFIX + option.lstrip("-").upper().replace("-", "_")


def _long_option(action: argparse.Action) -> str | None:
    longs = [opt for opt in action.option_strings if opt.startswith("--")]
    return longs[0] if longs else None


def _given(option_strings: Sequence[str], argv: Sequence[str]) -> bool:
    for arg in argv:
        if arg == "--":
            return False
        name = arg.split("=", 1)[0]
        if name in option_strings:
            return True
    return False


def environment_argv(parser: argparse.ArgumentParser, argv: Sequence[str],
                     environ: Mapping[str, str]) -> list[str]:
    """The flags the environment sets that `argv` does not, as command-line words."""
    words: list[str] = []
    for action in parser._actions:  # argparse has no public list of its actions
        option = _long_option(action)
        if option is None or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = variable_name(option)
        if name not in environ or _given(action.option_strings, argv):
            continue
        value = environ[name].strip()
        if action.nargs == 0:  # store_true / store_false / store_const / count
            lowered = value.lower()
            if lowered in _TRUE:
                words.append(option)
            elif lowered not in _FALSE:
                raise EnvFlagError(f"{name}={value!r}: {option} is an on/off flag "
                                   "(1/true/yes/on or 0/false/no/off)")
        elif isinstance(action, argparse._AppendAction):
            for item in (part.strip() for part in value.split(",")):
                if item:
                    words.append(f"{option}={item}")
        else:
            words.append(f"{option}={value}")
    return words


def with_environment(parser: argparse.ArgumentParser, argv: Sequence[str],
                     environ: Mapping[str, str]) -> list[str]:
    """`argv` with the environment's flags in front (so the command line wins)."""
    return environment_argv(parser, argv, environ) + list(argv)
