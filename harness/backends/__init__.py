"""Rollout and training engines, registered lazily so that choosing one imports only it.

``vllm`` (rollout) and ``megatron`` (training) are GPU-only: their modules import vLLM and
megatron-core inside the engine constructors, after a CUDA check, so importing the harness (or
listing backends) never imports either.
"""

from harness.registry import BACKENDS

BACKENDS.register("hf", "harness.backends.hf:HFEngine")
BACKENDS.register("vllm", "harness.backends.vllm_engine:VLLMEngine")
BACKENDS.register("megatron", "harness.backends.megatron_engine:MegatronEngine")
