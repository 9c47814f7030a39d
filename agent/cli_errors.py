"""One-line command-line failures: `error [code]: message` on stderr and exit status 2
(one such line per problem when there are several).

Shared by every entry point (`python -m signaling`, `agent.offline`, `agent.peer`) so a
start-up mistake reads the same everywhere and a script can match the code.
"""

from __future__ import annotations

import logging
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
