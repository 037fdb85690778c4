"""MATH: competition mathematics with a final ``\\boxed{}`` answer, graded by math-verify.

The task class and its config are in :mod:`tasks.math.task`; importing this package registers
them."""

from tasks.math.task import MathTask

__all__ = ["MathTask"]
