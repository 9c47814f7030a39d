"""One-line command-line failures: `error [code]: message` on stderr and exit status 2
(one such line per problem when there are several).

Shared by every entry point (`python -m signaling`, `agent.offline`, `agent.peer`) so a
start-up mistake reads the same everywhere and a script can match the code. `CliParser` is
argparse with its mistakes in the same form: one `error [bad_argument]: ...` line naming the
closest known flag and where the full usage is, instead of the usage block and a line after
it.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from typing import NoReturn

from agent.errors import AgentError

EXIT_USAGE = 2

log = logging.getLogger("agent.cli")


class CliError(AgentError):
    """A start-up or usage mistake that ends the program with one line, no traceback."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


def format_cli_error(code: str, message: str) -> str:
    return f"error [{code}]: {message}"


def exit_with_error(code: str, message: str, *, cause: BaseException | None = None) -> NoReturn:
    """Print the line(s) and exit 2; the traceback only shows at --log-level debug."""
    if cause is not None:
        log.debug("%s", format_cli_error(code, message), exc_info=cause)
    for line in message.splitlines() or [""]:  # several problems: one coded line each
        print(format_cli_error(code, line), file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def program_name(module_form: str, script: str | None = None) -> str:
    """What the user typed to run the program: the console script's name when it was run as
    that (`duplex-agent`), else the module form (`python -m signaling`)."""
    if script is not None and sys.argv and os.path.basename(sys.argv[0]) == script:
        return script
    return module_form


def closest_flag(parser: argparse.ArgumentParser, message: str,
                 cutoff: float = 0.6) -> str | None:
    """The known flag nearest to an unknown one named in argparse's `message` (difflib's
    similarity at least `cutoff`)."""
    known = [flag for flag in parser._option_string_actions if flag.startswith("--")]
    words = message.split(":", 1)[-1].split()
    for word in words:
        if not word.startswith("-") or word in known:
            continue
        near = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=cutoff)
        if near:
            return near[0]
    return None


class CliParser(argparse.ArgumentParser):
    """argparse whose mistakes are one `error [bad_argument]: ...` line and exit 2: what is
    wrong, the nearest known flag to a misspelt one, the environment variable a bad value
    came from (`set_by`), and where the full usage is."""

    set_by: dict[str, str]  # flag -> the environment variable that gave its value

    def unknown_flag_hint(self, message: str, cutoff: float = 0.6) -> str:
        """What to add to argparse's "unrecognized arguments: ..." line: the closest flag."""
        near = closest_flag(self, message, cutoff)
        return "" if near is None else f" (did you mean {near}?)"

    def error(self, message: str) -> NoReturn:
        hint = ""
        if message.startswith("unrecognized arguments"):
            hint = self.unknown_flag_hint(message)
        flag = message.split(":", 1)[0].removeprefix("argument ").split("/")[-1]
        variable = getattr(self, "set_by", {}).get(flag)
        if variable is not None:
            hint = f" (from the environment: {variable})"
        exit_with_error("bad_argument", f"{message}{hint}; see `{self.prog} --help`")
