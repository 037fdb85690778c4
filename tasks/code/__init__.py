"""Code: write a program that passes hidden unit tests, graded in a sandbox (PRIME-style).

The task class and its config are in :mod:`tasks.code.task`; importing this package registers
them."""

from tasks.code import reward  # noqa: F401  (registers the verifier "code_tests")
from tasks.code.task import CodeTask

__all__ = ["CodeTask"]
