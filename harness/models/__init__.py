"""Model sources: ``tiny`` (built and warm-started locally), ``tiny_vlm`` (the tiny
vision-language model, likewise) and ``hf`` (a local dir or hub id)."""

from harness.registry import MODELS

MODELS.register("tiny", "harness.models.tiny:resolve_tiny")
MODELS.register("hf", "harness.models.tiny:resolve_hf")
MODELS.register("tiny_vlm", "harness.models.tiny_vlm:resolve_tiny_vlm")
