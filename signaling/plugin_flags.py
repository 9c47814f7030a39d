"""Command-line flags that plugins declare for themselves (`Plugin.flags`).

The parser looks at `--plugin` first and adds that plugin's flags in a group of their own, so
`python -m signaling --plugin personaplex --help` lists them and a third-party plugin gets
flags without editing this package. A flag for a plugin that is not selected is refused like
any unknown flag.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from agent.cli_errors import CliParser, exit_with_error
from agent.errors import AgentError
from agent.plugins.base import MODEL_FLAGS, Plugin, PluginFlag
from agent.plugins.registry import available_plugins, plugin_class

DEFAULT_PLUGIN = "echo"
# difflib's similarity above which an unknown flag is taken for a typo of a known one
# (--prot: --port 0.83); below it, another plugin's flag is looked for first (--upstream-kind
# is moshi-server's, not a typo of --upstream at 0.80).
TYPO_SIMILARITY = 0.82


def selected_plugin(argv: Sequence[str]) -> str:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--plugin", default=DEFAULT_PLUGIN)
    known, _ = peek.parse_known_args(list(argv))
    return str(known.plugin)


def flags_of(name: str) -> tuple[PluginFlag, ...]:
    """The flags plugin `name` declares; none when it cannot be found (loading it later gives
    the coded error)."""
    try:
        cls: type[Plugin] = plugin_class(name)
    except AgentError:
        return ()
    return tuple(getattr(cls, "flags", ()))


def plugin_extra(args: argparse.Namespace) -> dict[str, Any]:
    """The selected plugin's flag values, for `PluginOptions.extra`."""
    return {flag.dest: getattr(args, flag.dest, flag.default) for flag in flags_of(args.plugin)}


def refuse_other_model_flags(parser: argparse.ArgumentParser, args: argparse.Namespace,
                             cls: type[Plugin]) -> None:
    """A shared model flag (`--model-dir`, `--upstream`, ...) given to a plugin that does not
    read it is refused in one line, as another plugin's own flag is: it would do nothing."""
    if cls.model_flags is None:
        return
    for flag in MODEL_FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        if flag in cls.model_flags or getattr(args, dest) == parser.get_default(dest):
            continue
        takes = (f"its model flags: {', '.join(sorted(cls.model_flags))}" if cls.model_flags
                 else "it takes none of the model flags")
        exit_with_error("flag_not_for_plugin", f"{flag} is not an option of the {args.plugin} "
                        f"plugin ({takes}); see `{parser.prog} --plugin {args.plugin} --help`")


class PluginFlagsParser(CliParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._declared: set[str] = set()

    # (typeshed overloads parse_known_args on the namespace's type; this one takes any)
    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        self.add_plugin_flags(selected_plugin(argv))
        return super().parse_known_args(argv, namespace)

    def unknown_flag_hint(self, message: str, cutoff: float = 0.6) -> str:
        """A near miss of a known flag (a typo); else the plugins that own the unknown flag
        (looked up only now: finding them imports every plugin); else the closest flag."""
        typo = super().unknown_flag_hint(message, TYPO_SIMILARITY)
        if typo:
            return typo
        words = [word.split("=", 1)[0] for word in message.split(":", 1)[-1].split()]
        for word in (w for w in words if w.startswith("--")):
            owners = [name for name in available_plugins()
                      if any(flag.name == word for flag in flags_of(name))]
            if owners:
                return (f" ({word} is an option of the {', '.join(owners)} plugin"
                        f"{'s' if len(owners) > 1 else ''}: add --plugin {owners[0]})")
        return super().unknown_flag_hint(message, cutoff)

    def add_plugin_flags(self, name: str) -> None:
        flags = [flag for flag in flags_of(name) if flag.dest not in self._declared]
        if not flags:
            return
        group = self.add_argument_group(f"options of the {name} plugin")
        for flag in flags:
            extra: dict[str, Any] = {}
            if flag.type is not None:
                extra["type"] = flag.type
            if flag.choices is not None:
                extra["choices"] = flag.choices
            if flag.metavar is not None:
                extra["metavar"] = flag.metavar
            group.add_argument(flag.name, default=flag.default, help=flag.help, **extra)
            self._declared.add(flag.dest)
