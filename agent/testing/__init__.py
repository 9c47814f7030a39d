"""Developer and test tooling, apart from the runtime: the headless peer (`python -m
agent.peer` is its thin entry point), the built-in test signal and its echo measurements, and a
fake clock. Nothing under agent/ outside this package imports it."""
