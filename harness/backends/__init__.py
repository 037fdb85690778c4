"""Rollout and training engines, registered lazily so that choosing one imports only it."""

from harness.registry import BACKENDS

BACKENDS.register("hf", "harness.backends.hf:HFEngine")
