"""Geometry3K: geometry problems with a diagram, answered by choice letter or by value.

The task class and its config are in :mod:`tasks.geometry3k.task`; importing this package registers
them."""

from tasks.geometry3k.task import Geometry3kTask

__all__ = ["Geometry3kTask"]
