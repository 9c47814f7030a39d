"""One coded error root: every exception class defined in agent/ or signaling/ derives from
`agent.errors.AgentError` (a `code` for machines, a message for people), so a caller can catch
the family by one name and every start-up mistake prints as `error [code]: message`.

Read from the source with `ast` (no module is imported): each class's bases are resolved
through its module's imports to the class they name, and followed until a builtin exception
(not rooted) or AgentError (rooted)."""

from __future__ import annotations

import ast
import builtins
import functools
from pathlib import Path

import pytest

from agent.cli_errors import CliError
from agent.errors import AgentError
from agent.testing.peer.transports.base import PeerError
from signaling.cluster.claim import ClaimError
from signaling.cluster.forwarding import NodeUnreachable
from signaling.cluster.settings import ClusterFlagError
from signaling.cluster.store import StoreDown
from signaling.env_flags import EnvFlagError
from signaling.sip.trunks import TrunkFileError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "signaling")
THE_ROOT = "agent.errors.AgentError"
# Exception classes that must not derive from AgentError, each with the reason (none today).
OUTSIDE_THE_ROOT: dict[str, str] = {}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imported_names(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
    return names


def _base_name(base: ast.expr, module: str, imported: dict[str, str]) -> str:
    if isinstance(base, ast.Subscript):  # Generic[T]
        base = base.value
    text = ast.unparse(base)
    head, _, rest = text.partition(".")
    tail = "." + rest if rest else ""
    if head in imported:
        return imported[head] + tail
    if hasattr(builtins, head):
        return "builtins." + text
    return f"{module}.{text}"


@functools.cache
def project_classes() -> dict[str, list[str]]:
    """Every class of agent/ and signaling/ (dotted name) -> its bases' dotted names."""
    classes: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = module_name(path)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            imported = _imported_names(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    classes[f"{module}.{node.name}"] = [
                        _base_name(base, module, imported) for base in node.bases]
    return classes


def _is_exception(name: str, classes: dict[str, list[str]], seen: set[str]) -> bool:
    if name in seen:
        return False
    seen.add(name)
    if name.startswith("builtins."):
        found = getattr(builtins, name.removeprefix("builtins."), None)
        return isinstance(found, type) and issubclass(found, BaseException)
    if name not in classes:  # another library's class: judged by its name
        return name.rsplit(".", 1)[-1].endswith(("Error", "Exception"))
    return any(_is_exception(base, classes, seen) for base in classes[name])


def _is_rooted(name: str, classes: dict[str, list[str]], seen: set[str]) -> bool:
    if name == THE_ROOT:
        return True
    if name in seen or name not in classes:
        return False
    seen.add(name)
    return any(_is_rooted(base, classes, seen) for base in classes[name])


def unrooted_exceptions() -> list[str]:
    classes = project_classes()
    return sorted(name for name in classes
                  if name != THE_ROOT and _is_exception(name, classes, set())
                  and not _is_rooted(name, classes, set()) and name not in OUTSIDE_THE_ROOT)


def test_every_exception_class_derives_from_agent_error() -> None:
    found = unrooted_exceptions()
    assert not found, ("exception classes outside agent.errors.AgentError (derive from it, "
                       "or list one in OUTSIDE_THE_ROOT with why): " + ", ".join(found))


def test_the_scan_sees_the_exceptions_it_judges() -> None:
    classes = project_classes()
    for name in ("agent.cli_errors.CliError", "signaling.cluster.store.StoreDown",
                 "agent.testing.peer.transports.base.PeerError"):
        assert _is_exception(name, classes, set()) and _is_rooted(name, classes, set())
    assert not _is_exception("agent.cli_errors.CliParser", classes, set())


@pytest.mark.parametrize("error", [
    PeerError("no_dtmf", "m"), EnvFlagError("m"), TrunkFileError("m"),
    ClusterFlagError("cluster_url_invalid", "m"), ClaimError("cluster_full", "m"),
    NodeUnreachable("m"), StoreDown("m"), CliError("bad_argument", "m")])
def test_every_error_carries_a_code_and_its_message(error: AgentError) -> None:
    assert isinstance(error, AgentError)
    assert error.code and error.message == "m"
    # What their callers read stays as it was: the message alone, the peer's with its code.
    assert str(error) == (f"{error.code}: m" if isinstance(error, PeerError) else "m")


def test_flag_and_file_mistakes_are_still_value_errors() -> None:
    for error in (EnvFlagError("m"), TrunkFileError("m"),
                  ClusterFlagError("cluster_url_invalid", "m")):
        assert isinstance(error, ValueError)
