"""Find plugins by id: built-ins plus anything installed under the `duplex_agent.plugins`
entry-point group, so a third-party plugin ships as a pip package."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from agent.plugins.base import Plugin, PluginError, PluginOptions

ENTRY_POINT_GROUP = "duplex_agent.plugins"

# Built-ins resolve even when the project runs from a source tree without being installed.
BUILTIN_PLUGINS: dict[str, str] = {
    "echo": "agent.plugins.echo:EchoPlugin",
    "personaplex": "agent.plugins.personaplex.plugin:PersonaPlexPlugin",
    "moshi": "agent.plugins.personaplex.plugin:MoshiPlugin",
    "vllm-omni": "agent.plugins.remote.vllm_omni:VllmOmniPlugin",
    "moshi-server": "agent.plugins.remote.moshi_server:MoshiServerPlugin",
}


def _installed() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_plugins() -> list[str]:
    return sorted({**BUILTIN_PLUGINS, **_installed()})


def plugin_class(name: str) -> type[Plugin]:
    target = {**BUILTIN_PLUGINS, **_installed()}.get(name)
    if target is None:
        raise PluginError(
            "unknown_plugin",
            f"no plugin named '{name}'; available: {', '.join(available_plugins())}",
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PluginError("unknown_plugin", f"plugin '{name}' is not installed: {exc}") from exc
    return getattr(module, attr)


def load_plugin(name: str, options: PluginOptions | None = None) -> Plugin:
    return plugin_class(name).from_options(options or PluginOptions())
