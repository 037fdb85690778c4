"""Agentic QA: answer multi-hop questions by calling tools (``search``, ``python``) over several

The task class and its config are in :mod:`tasks.agentic_qa.task`; importing this package registers
them."""

from tasks.agentic_qa.task import AgenticQATask

__all__ = ["AgenticQATask"]
