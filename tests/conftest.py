"""The suite's shared fixtures and markers.

Fixture modules live in tests/support/ and are registered here once, so a test names a
fixture as an argument and never imports it. Markers (registered in pyproject.toml, checked
with --strict-markers) are set by the tests themselves: `pytestmark` for whole modules,
`@pytest.mark.<name>` for single tests.
"""

pytest_plugins = [
    "tests.support.agents",  # loopback_ice (autouse), start_agent, echo_agent
    "tests.support.realtime",  # realtime_clients
    "tests.support.turn",  # turn_server (coturn)
]
