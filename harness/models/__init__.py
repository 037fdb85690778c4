"""Model sources: ``tiny`` (built and warm-started locally) and ``hf`` (a local dir or hub id)."""

from harness.registry import MODELS

MODELS.register("tiny", "harness.models.tiny:resolve_tiny")
MODELS.register("hf", "harness.models.tiny:resolve_hf")
