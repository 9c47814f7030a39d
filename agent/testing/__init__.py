"""Developer and test tooling, apart from the runtime: the headless peer (`python -m
agent.peer` is its thin entry point), the built-in test signal and its echo measurements, a
fake clock, the Opus quality measure, headless Chromium as the tests and benchmarks launch it
(`chromium.py`), and protocol-faithful fakes of the remote engines (`fake_engines.py`).
Nothing under agent/ outside this package imports it."""
