"""``task=custom``: your prompts, your answers, your reward; eval sets named in the config.

The task class and its config are in :mod:`tasks.custom.task`; importing this package registers
them."""

from tasks.custom.task import CustomTask

__all__ = ["CustomTask"]
