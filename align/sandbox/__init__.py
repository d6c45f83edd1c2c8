"""Untrusted Python in a bounded child process (align.sandbox.run; what it is and is not: that module's docstring),
and tests as a reward (align.sandbox.code_tests). Stdlib only."""
