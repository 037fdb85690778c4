"""vLLM rollout engine (GPU only), colocated with the train engine on the same GPUs.

vLLM runs inside the training process (``distributed_executor_backend="external_launcher"``:
one worker per torchrun rank, reusing the trainer's process group; a world of one without
torchrun), so the train engine's weights reach it without a disk round trip or a second process:
``model.load_weights`` takes (HF name, full tensor) pairs, fuses q/k/v and gate/up and takes its
own tensor-parallel slice. The phases share GPU memory through sleep mode::

    update_weights: wake_up(["weights"]) -> load_weights(train_engine.export_hf_weights())
                    -> reset_prefix_cache() -> wake_up(["kv_cache"])
    generate        (awake)
    sleep():        sleep(level)      called by the trainer when the rollout phase ends

Level 2 (default) drops weights and KV cache, so the weights pushed by the next update are the
only ones it ever samples from; the engine refuses to generate from dropped weights.

Token-in/token-out: prompts go in as ``{"prompt_token_ids": ids}``, responses come back as
ids with the sampled token's log-prob (``logprobs=0``, ``logprobs_mode="processed_logprobs"``:
after temperature, which is the trainer's log softmax(logits / T); with top-p/top-k < full the
processed log-probs are renormalised over the kept tokens, so keep them off for RL). These
behaviour log-probs become ``rollout_logprobs``; the trainer compares them with its own
(``rollout_corr/*`` metrics) and can correct with truncated importance sampling.

Seeds: every call draws a base seed from the engine's generator; prompt i gets seed
``base + i * n`` (vLLM gives the j-th of n samples ``seed + j``), so a run is reproducible for a
given vLLM build and batch, and every rank of a tensor-parallel group samples the same thing, as
external_launcher requires. Data-parallel ranks offset the base by their rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness.backends.distributed import ensure_distributed, require_cuda
from harness.engines import RolloutEngine
from harness.types import Example, SamplingParams, Trajectory

VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams rejects larger temperatures


def sampling_kwargs(params: SamplingParams, seed: int | None,
                    stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for the harness's sampling parameters. vLLM
    runs without its tokenizer (token ids in and out), so the end-of-sequence ids -- and the
    tool tags of multi-turn tasks, which are single special tokens in chat models (Qwen's
    ``</tool_call>``) -- are passed as ``stop_token_ids``; the stop token is the last id of the
    response, as in the hf engine."""
    if not 0 < params.temperature <= VLLM_MAX_TEMPERATURE:
        raise ValueError(f"temperature {params.temperature}: vLLM samples in (0, "
                         f"{VLLM_MAX_TEMPERATURE}]; use backend=hf for hotter sampling")
    kwargs: dict[str, Any] = {
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,  # 0 = off in vLLM too
        "max_tokens": params.max_new_tokens,  # vLLM's default is 16: always set
        "logprobs": 0,  # only the sampled token's log-prob
        "seed": seed,
        "detokenize": False,  # token-out: the harness decodes with its own tokenizer
        "stop_token_ids": list(stop_token_ids or []),
    }
    return kwargs


def llm_kwargs(model_path: str, vcfg: Any, seed: int, dtype: str, max_model_len: int | None,
               ) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for a colocated RL rollout engine."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tensor_parallel_size": vcfg.tensor_parallel_size,
        "dtype": dtype,  # never "auto": a float32 config would become float16
        "seed": seed,
        "gpu_memory_utilization": vcfg.gpu_memory_utilization,
        "enforce_eager": vcfg.enforce_eager,
        "enable_sleep_mode": vcfg.sleep_level > 0,
        "distributed_executor_backend": "external_launcher",
        "logprobs_mode": "processed_logprobs",
        "max_num_batched_tokens": vcfg.max_num_batched_tokens,
        "max_num_seqs": vcfg.max_num_seqs,
        "enable_prefix_caching": vcfg.enable_prefix_caching,
        "load_format": vcfg.load_format,
        "generation_config": "vllm",  # the harness's sampling parameters, not the model's
        # token ids in and out: vLLM never needs the tokenizer (so rlbench's own character
        # tokenizer and any checkpoint's work alike); stops are token ids
        "skip_tokenizer_init": True,
    }
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    return kwargs


def parse_outputs(outputs: Iterable[Any], prompts: list[list[int]], n: int
                  ) -> list[Trajectory]:
    """vLLM ``RequestOutput``s (in prompt order) -> trajectories, prompt-major. The sampled
    token's log-prob is read at ``token_ids[i]`` from position i's log-prob dict."""
    trajs: list[Trajectory] = []
    outputs = list(outputs)
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    for prompt, out in zip(prompts, outputs):
        if len(out.outputs) != n:
            raise RuntimeError(f"vLLM returned {len(out.outputs)} samples, expected n={n}")
        for comp in out.outputs:
            ids = list(comp.token_ids)
            if comp.logprobs is None or len(comp.logprobs) != len(ids):
                raise RuntimeError("vLLM returned no per-token log-probs (logprobs=0 expected)")
            lp = torch.tensor([float(pos[tok].logprob) for pos, tok in zip(comp.logprobs, ids)],
                              dtype=torch.float32)
            trajs.append(Trajectory(prompt_ids=list(prompt), response_ids=ids, logprobs=lp,
                                    finish_reason="length" if comp.finish_reason == "length"
                                    else "stop"))
    return trajs


def eos_ids(model_path: str, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the model's generation config's and the tokenizer's (as the hf
    engine stops on)."""
    ids = [tokenizer.eos_token_id]
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids.extend(eos if isinstance(eos, list) else [eos])
    except OSError:  # no generation_config.json
        pass
    return sorted({i for i in ids if i is not None})


def hf_weights(train_engine: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of a train engine: its own export (Megatron gathers and
    unfuses), else a transformers model's parameters as they are."""
    export = getattr(train_engine, "export_hf_weights", None)
    if export is not None:
        return export()
    return ((name, p.detach()) for name, p in train_engine.model.named_parameters())


def collapse_runs(ids: list[int], placeholder_ids: Iterable[int]) -> list[int]:
    """``ids`` with every run of one placeholder id shrunk to a single id."""
    keep = set(placeholder_ids)
    out: list[int] = []
    for tok in ids:
        if not (tok in keep and out and out[-1] == tok):
            out.append(tok)
    return out


def vllm_prompt(prompt: list[int], placeholder_ids: Iterable[int] = ()) -> dict[str, Any]:
    """vLLM's prompt dict: token ids, plus ``multi_modal_data={"image": [...]}`` when the prompt
    carries images (a ``MultimodalPrompt``).

    The trainer's ids hold each image's placeholder already expanded by the HF processor (N
    ``<|image_pad|>`` for an image of N merged patches). vLLM 0.32 applies its own prompt update
    to token prompts too: for each image, in order, it replaces the next single pad with N pads.
    Sent as they are, the expanded ids would become 2N - 1 pads for one image (and garbage for
    several), so vLLM would sample from another context than the one trained on. Each run of a
    placeholder id (``placeholder_ids``: the model's image and video pad ids) is therefore
    collapsed to one pad first, as verl does for Qwen2-VL / Qwen2.5-VL; vLLM's update restores
    exactly the trainer's ids."""
    ids = list(prompt)
    images = getattr(prompt, "images", None)
    if not images:
        return {"prompt_token_ids": ids}
    placeholder_ids = set(placeholder_ids)
    if placeholder_ids:
        ids = collapse_runs(ids, placeholder_ids)
        runs = sum(1 for tok in ids if tok in placeholder_ids)
        if runs != len(images):
            raise ValueError(f"a prompt with {len(images)} image(s) holds {runs} run(s) of "
                             f"image placeholder ids {sorted(placeholder_ids)}; vLLM needs one "
                             "per image (encode it with the model's processor)")
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": list(images)}}


def _vision_config(model_path: str) -> Any | None:
    """The HF config of a model with a vision tower, else None."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return None
    return config if getattr(config, "vision_config", None) is not None else None


def _make_llm(**kwargs: Any) -> Any:
    from vllm import LLM

    return LLM(**kwargs)


def _make_sampling(**kwargs: Any) -> Any:
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(**kwargs)


class VLLMEngine(RolloutEngine):
    """``RolloutEngine`` over an in-process ``vllm.LLM``; receives weights from a train engine.
    ``llm_factory`` / ``sampling_factory`` replace vLLM in tests (a fake ``LLM``)."""

    receives_weights = True  # update_weights really copies: separate train engines are fine
    requires_cuda = True

    def __init__(self, model_path: str, backend_cfg: Any, seed: int, optim_cfg: Any = None,
                 total_steps: int = 1, need_reference: bool = False,
                 attn_implementation: str | None = None,
                 llm_factory: Callable[..., Any] | None = None,
                 sampling_factory: Callable[..., Any] | None = None) -> None:
        from harness.models.tiny import load_tokenizer

        if llm_factory is None:
            require_cuda("vllm")
            ensure_distributed()
        vcfg = backend_cfg.vllm
        self.vcfg = vcfg
        self.tokenizer = load_tokenizer(model_path)
        self.vocab_size = len(self.tokenizer)  # ARPO normalises entropy by ln V
        self.pad_token_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                             else self.tokenizer.eos_token_id)
        self.eos_token_ids = eos_ids(model_path, self.tokenizer)
        self.tool_stop_ids: list[int] = []  # multi-turn tasks add their tool tags' token ids
        self.dp_rank = int(os.environ.get("RANK", "0")) // max(vcfg.tensor_parallel_size, 1)
        self.device = torch.device("cpu")  # where seed generators live (evaluation makes one)
        self.generator = torch.Generator().manual_seed(seed)
        self._sampling = sampling_factory or _make_sampling
        kwargs = llm_kwargs(model_path, vcfg, seed + self.dp_rank, backend_cfg.dtype,
                            vcfg.max_model_len)
        self.model_path, self._mm = model_path, None
        self.placeholder_ids: list[int] = []  # image / video pad ids, collapsed for vLLM
        vision = _vision_config(model_path)
        if vision is not None:  # vLLM's own processor turns images into embeddings
            kwargs["skip_tokenizer_init"] = False
            self.placeholder_ids = [i for i in (getattr(vision, "image_token_id", None),
                                                getattr(vision, "video_token_id", None))
                                    if i is not None]
        self.llm = (llm_factory or _make_llm)(**kwargs)
        self.sleep_level = vcfg.sleep_level
        self.asleep = False
        # load_format=dummy: random weights until the first update_weights
        self.weights_valid = vcfg.load_format != "dummy"

    # -- rollout --------------------------------------------------------------------------------
    def encode_prompt(self, example: Example) -> list[int]:
        """Prompt ids; with images, a ``MultimodalPrompt`` built by the model's HF processor
        (the ids the train engine trains on, with the pixel inputs it trains with), whose raw
        images go to vLLM as ``multi_modal_data``."""
        if example.prompt_ids is not None:  # cut to the prompt limit (harness/prompts.py)
            return list(example.prompt_ids)
        if example.images:
            from harness.models.multimodal import encode_multimodal

            if self._mm is None:
                from transformers import AutoConfig, AutoProcessor

                self._mm = (AutoProcessor.from_pretrained(self.model_path),
                            AutoConfig.from_pretrained(self.model_path))
            return encode_multimodal(example, self.tokenizer, self._mm[0], self._mm[1])
        if isinstance(example.prompt, str):
            return self.tokenizer.encode(example.prompt, add_special_tokens=False)
        return list(self.tokenizer.apply_chat_template(
            example.prompt, add_generation_prompt=True, tokenize=True, return_dict=False))

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[Trajectory]:
        if not self.weights_valid:
            raise RuntimeError("vLLM holds no valid weights (dummy load or sleep level 2): "
                               "call update_weights(train_engine) first")
        if self.asleep:  # level 1 kept the weights in host memory
            self.llm.wake_up()
            self.asleep = False
        gen = generator or self.generator
        base = int(torch.randint(0, 2**30, (1,), generator=gen)) + self.dp_rank * 2**30
        stops = self.eos_token_ids + self.tool_stop_ids
        per_prompt = [self._sampling(**sampling_kwargs(params, base + i * params.n, stops))
                      for i in range(len(prompts))]
        outputs = self.llm.generate([vllm_prompt(p, self.placeholder_ids) for p in prompts],
                                    sampling_params=per_prompt, use_tqdm=False)
        trajs = parse_outputs(outputs, prompts, params.n)
        for i, traj in enumerate(trajs):  # the train engine's forward reuses these pixels
            traj.mm_inputs = getattr(prompts[i // params.n], "mm_inputs", None)
        if params.stop:
            for traj in trajs:
                self._cut_at_stop(traj, tuple(params.stop))
        texts = self.tokenizer.batch_decode(
            [t.response_ids[:-1] if t.finish_reason == "stop" else t.response_ids for t in trajs],
            skip_special_tokens=True)
        for i, (traj, text) in enumerate(zip(trajs, texts)):
            traj.text, traj.group_id = text, i // params.n
        return trajs

    def _cut_at_stop(self, traj: Trajectory, stops: tuple[str, ...]) -> None:
        """Stop strings (multi-turn tool tags) are applied here, token by token as the hf
        engine does: vLLM runs without a tokenizer, so it generated past them; the tokens up to
        the one completing the first stop string are kept (their log-probs are unchanged by
        what was sampled after them). Tool tags given as ids (``tool_stop_ids``) stop vLLM
        itself and waste nothing."""
        keep = max(len(s) for s in stops)
        tail = ""
        for i, tok in enumerate(traj.response_ids):
            tail = (tail + self._piece(tok))[-keep:]
            hit = next((s for s in stops if tail.endswith(s)), None)
            if hit is not None:
                traj.response_ids = traj.response_ids[: i + 1]
                traj.logprobs = traj.logprobs[: i + 1]
                traj.finish_reason, traj.stop_string = "stop", hit
                return

    def _piece(self, token_id: int) -> str:
        cache = self.__dict__.setdefault("_pieces", {})
        if token_id not in cache:
            cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return cache[token_id]

    def decode(self, ids: list[int]) -> str:
        """Response text of ``ids`` (EOS and other special tokens dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a text span appended mid-response (a tool result)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def sleep(self) -> None:
        """Free the GPU for training (the trainer calls this when the rollout phase ends)."""
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
            if self.sleep_level >= 2:
                self.weights_valid = False

    def update_weights(self, train_engine: Any) -> None:
        """Copy the train engine's current weights in, layer by layer, without disk."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        self._model().load_weights(hf_weights(train_engine))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.weights_valid = True

    def _model(self) -> Any:
        # external_launcher keeps the engine core in this process, so the worker's model is
        # reachable (the path TRL's colocate mode uses)
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    # -- train-engine surface the trainer may touch -------------------------------------------
    lr = 0.0

    def save(self, path: Any) -> None:  # weights are the train engine's to save
        pass
