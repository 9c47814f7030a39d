"""Developer and test tooling that users run, apart from the runtime: the headless peer
(`python -m agent.peer` is its thin entry point) and its pytest plugin, and the built-in test
signal with its echo measurements. The doubles only the project's own tests and benchmarks use
(fake clock, fake engines, headless Chromium, ...) live in tests/support/, outside the wheel.
Nothing under agent/ outside this package imports it."""
