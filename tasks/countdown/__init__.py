"""Countdown: combine the given numbers with + - * / (each exactly once) to reach a target.

The task class and its config are in :mod:`tasks.countdown.task`; importing this package registers
them."""

from tasks.countdown import reward  # noqa: F401  (registers the verifier "countdown")
from tasks.countdown.task import CountdownTask

__all__ = ["CountdownTask"]
