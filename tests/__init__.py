"""The test suite (a package, so its folders' modules have unique names:
tests.<folder>.<module>)."""
