"""Hugging Face transformers backend: rollout and training on one model (CPU or GPU).

Rollout is a batched sampling loop over the model's own forward with a KV cache (prefill once,
then one token per step), so it records exactly what RL needs and nothing else: the sampled ids,
the behaviour log-prob of each (log-softmax of logits / T, before top-p/top-k truncation, the
same convention as verl and vLLM's ``logprobs``) and, when asked, the entropy of that
distribution. Training computes the same quantities with gradients for a padded
:class:`RolloutBatch`, then AdamW with gradient clipping. Rollout and training share one model,
so ``update_weights`` is a no-op.

Vision-language models (Qwen2.5-VL through ``AutoModelForImageTextToText`` + ``AutoProcessor``,
and the tiny VLM of :mod:`harness.models.tiny_vlm`): ``encode_prompt`` of an example with
images returns a :class:`MultimodalPrompt` carrying its pixel inputs; the prefill takes them,
each trajectory keeps the same tensors, and ``forward`` feeds them back from the batch's
trajectories (:mod:`harness.models.multimodal`). Text-only prompts take the unchanged path.
A VLM with the :class:`~harness.backends.kv_decode.ImagePromptLM` contract (the tiny VLM:
``pixel_values`` only, 1-D positions) takes the text models' preallocated-cache decode and
shared-prefix training forward; Qwen2.5-VL keeps the ``DynamicCache`` and whole-row forward.
"""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness.backends.kv_decode import CachedDecoder, covers_inputs, shared_prefix_logits
from harness.backends.kv_decode import supports as kv_supports
from harness.batch import RolloutBatch
from harness.engines import RolloutEngine, TrainEngine
from harness.models.multimodal import (
    collate_mm,
    encode_multimodal,
    is_vision_config,
    mm_position_ids,
)
from harness.models.tiny import TOKENIZER_MARKER, load_tokenizer
from harness.types import Example, SamplingParams, Trajectory


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def token_logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token) and H(pi) per position for pi = softmax(logits / temperature), in fp32.
    The entropy carries a gradient only when asked (an entropy bonus); as a diagnostic it is
    computed outside the graph so it costs no activation memory."""
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        source = logp_all if entropy_grad else logp_all.detach()
        entropy = -(source.exp() * source).sum(-1)
    return logp, entropy


def auto_model_class(model_path: str | Path) -> Any:
    """``AutoModelForImageTextToText`` for a VLM with a vision tower config (Qwen2.5-VL),
    else ``AutoModelForCausalLM`` (text models and the tiny VLM, registered on import)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    import harness.models.tiny_vlm  # noqa: F401  registers the tiny VLM with the Auto classes

    config = AutoConfig.from_pretrained(model_path)
    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def filter_logits(logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # keep the token crossing top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFEngine(TrainEngine, RolloutEngine):
    """``RolloutEngine`` and ``TrainEngine`` over one ``AutoModelForCausalLM``."""

    can_forward = True  # the rollout engine is the train engine: it can score its samples

    def __init__(
        self,
        model_path: str,
        backend_cfg: Any,
        seed: int,
        optim_cfg: Any | None = None,
        total_steps: int = 1,
        need_reference: bool = False,
        attn_implementation: str | None = None,
    ) -> None:
        if backend_cfg.threads > 0:
            torch.set_num_threads(backend_cfg.threads)
        self.model_path = model_path
        self.device = resolve_device(backend_cfg.device)
        dtype = getattr(torch, backend_cfg.dtype)
        self.tokenizer = load_tokenizer(model_path)
        attn_impl = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = auto_model_class(model_path).from_pretrained(
            model_path, dtype=dtype, **attn_impl
        ).to(self.device)
        self.model.eval()
        self.processor = None
        if is_vision_config(self.model.config):  # Qwen2.5-VL: chat template + image processor
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(model_path)
        self.gen_batch_size = backend_cfg.gen_batch_size
        # rollout KV cache: "static" = preallocated (kv_decode.py) where the model is covered,
        # "dynamic" = transformers' DynamicCache through the model's own forward
        self.kv_cache = getattr(backend_cfg, "kv_cache", "static")
        # training forward: each distinct prompt of a micro-batch run once (kv_decode.py)
        self.shared_prefix = bool(getattr(backend_cfg, "shared_prefix", True))
        self.pad_token_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        eos.append(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted({e for e in eos if e is not None})
        self.vocab_size = len(self.tokenizer)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.ref_model = None
        if need_reference:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = None
        self.scheduler = None
        if optim_cfg is not None:
            self._build_optimizer(optim_cfg, total_steps)

    @property
    def _decoder(self) -> CachedDecoder | None:
        """The preallocated-cache decoder, when ``kv_cache`` is static and the model is covered."""
        if self.kv_cache != "static" or not kv_supports(self.model):
            return None
        if getattr(self, "_cached_decoder", None) is None:
            self._cached_decoder = CachedDecoder(self.model)
        return self._cached_decoder

    # -- rollout --------------------------------------------------------------------------------
    def decode(self, ids: list[int]) -> str:
        """Response text of ``ids`` (EOS and other special tokens dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a text span appended mid-response (a tool result), no special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _piece(self, token_id: int) -> str:
        """The text of one token (cached), for stop-string matching during sampling."""
        cache = self.__dict__.setdefault("_pieces", {})
        if token_id not in cache:
            cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return cache[token_id]

    def encode_prompt(self, example: Example) -> list[int]:
        """Prompt ids; with images, a :class:`MultimodalPrompt` that carries the pixels."""
        if example.prompt_ids is not None:  # cut to the prompt limit (harness/prompts.py)
            return list(example.prompt_ids)
        if example.images:
            return encode_multimodal(example, self.tokenizer, self.processor, self.model.config)
        if isinstance(example.prompt, str):
            return self.tokenizer.encode(example.prompt, add_special_tokens=False)
        return list(
            self.tokenizer.apply_chat_template(
                example.prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Trajectory]:
        out: list[Trajectory] = []
        # chunks of whole prompts, so that a prompt's n samples share one prefill
        size = max(1, self.gen_batch_size // params.n) if self.gen_batch_size > 0 else len(prompts)
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            out.extend(self._sample(chunk, params, generator or self.generator))
        eos = set(self.eos_token_ids)
        texts = self.tokenizer.batch_decode(
            [t.response_ids[:-1] if t.response_ids and t.response_ids[-1] in eos
             else t.response_ids for t in out],
            skip_special_tokens=True,
        )
        for i, (traj, text) in enumerate(zip(out, texts)):
            traj.text, traj.group_id = text, i // params.n
        return out

    def _sample(
        self, unique_prompts: list[list[int]], params: SamplingParams, gen: torch.Generator
    ) -> list[Trajectory]:
        """``params.n`` samples of each prompt; rows are prompt-major (p0 x n, p1 x n, ...)."""
        U, P = len(unique_prompts), max(len(p) for p in unique_prompts)
        ids = torch.full((U, P), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((U, P), dtype=torch.long)
        for i, p in enumerate(unique_prompts):  # left padding: every row's next token is column P
            ids[i, P - len(p) :] = torch.as_tensor(p)
            attn[i, P - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        # multimodal prompts: their pixel inputs go into the prefill (and onto the trajectories)
        row_mm = [getattr(p, "mm_inputs", None) for p in unique_prompts]
        mm = self._mm_to_device(collate_mm(row_mm))
        if mm is not None:
            mpos = mm_position_ids(self.model, ids, attn, mm)
            pos = pos if mpos is None else mpos  # [3, U, P] multimodal RoPE (Qwen2.5-VL)
        # The n samples of a prompt share its prefill: run it once per prompt, then repeat the KV
        # cache n times (prefill is a third of the rollout on the tiny model otherwise).
        T = params.max_new_tokens
        decoder = self._decoder if covers_inputs(self.model, mm) else None
        if decoder is not None:  # preallocated cache (kv_decode.py): no growth by torch.cat
            kv = decoder.new_cache(U, P + (T if params.n == 1 else 0), max_position=P + T)
            # images enter through the prompt's embeddings only: a decoded token is never a
            # placeholder (the model's constrain_logits pins it), so steps embed their ids
            embeds = None if mm is None else self.model.embed_inputs(ids, mm["pixel_values"])
            last = decoder.step(kv, ids, pos, attn, embeds)
            if params.n > 1:
                kv = kv.repeat_interleave(params.n, extra=T)
        else:
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                             use_cache=True, logits_to_keep=1, **(mm or {}))
            cache, last = out.past_key_values, out.logits[:, -1, :]
            if params.n > 1:
                cache.batch_repeat_interleave(params.n)
        if params.n > 1:
            attn, pos = attn.repeat_interleave(params.n, 0), pos.repeat_interleave(params.n, -2)
            last = last.repeat_interleave(params.n, 0)
        prompts = [p for p in unique_prompts for _ in range(params.n)]
        N = len(prompts)
        tokens = torch.full((N, T), self.pad_token_id, dtype=torch.long, device=self.device)
        logps = torch.zeros((N, T), device=self.device)
        ents = torch.zeros((N, T), device=self.device)
        eos = torch.as_tensor(self.eos_token_ids, device=self.device)
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        lengths = torch.full((N,), T, dtype=torch.long, device=self.device)
        next_pos = pos[..., -1:] + 1
        live = torch.arange(N, device=self.device)  # the rows the decoder's cache still holds
        steps = 0
        stops = tuple(params.stop)
        keep = max((len(s) for s in stops), default=0)
        tails = [""] * N  # the last ``keep`` characters of each response, for stop strings
        matched: list[str | None] = [None] * N
        for t in range(T):
            logits = last.float() / params.temperature
            logp_all = F.log_softmax(logits, dim=-1)
            sample_logits = filter_logits(logits, params.top_p, params.top_k)
            probs = sample_logits.softmax(-1) if sample_logits is not logits else logp_all.exp()
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_token_id), nxt)
            tokens[:, t] = nxt
            logps[:, t] = logp_all.gather(-1, nxt[:, None]).squeeze(-1)
            if params.entropy:
                ent_logp = (logp_all.topk(params.entropy_topk, -1).values
                            if params.entropy_topk > 0 else logp_all)
                ents[:, t] = -(ent_logp.exp() * ent_logp).nan_to_num().sum(-1)
            hit = ~done & torch.isin(nxt, eos)
            if stops:
                for i in (~done & ~hit).nonzero().flatten().tolist():
                    tails[i] = (tails[i] + self._piece(int(nxt[i])))[-keep:]
                    matched[i] = next((s for s in stops if tails[i].endswith(s)), None)
                    if matched[i] is not None:
                        hit[i] = True
            lengths = torch.where(hit, torch.full_like(lengths, t + 1), lengths)
            done = done | hit
            steps = t + 1
            if bool(done.all()) or t == T - 1:
                break
            if decoder is not None:
                # Finished rows leave the decode batch once they are a quarter of it (a response
                # is ~60% of max_new_tokens on the tiny tasks). Sampling still draws over all N
                # rows, so the generator's stream, and every live row's sample, is unchanged.
                still = ~done[live]
                if int(still.sum()) <= 0.75 * len(live):
                    live = live[still]
                    kv = kv.select(still.nonzero().squeeze(-1))
                last[live] = decoder.step(kv, nxt[live, None], next_pos[live])
            else:
                attn = torch.cat([attn, attn.new_ones((N, 1))], dim=1)
                out = self.model(input_ids=nxt[:, None], attention_mask=attn,
                                 position_ids=next_pos, past_key_values=cache, use_cache=True)
                cache, last = out.past_key_values, out.logits[:, -1, :]
            next_pos = next_pos + 1
        lengths, done = lengths.clamp(max=steps).cpu(), done.cpu()
        # one pass per tensor, not per row: each row's values are a slice of one packed tensor
        keep = torch.arange(T)[None, :] < lengths[:, None]
        sizes = lengths.tolist()
        row_lp = logps.cpu()[keep].split(sizes)
        row_ent = ents.cpu()[keep].split(sizes) if params.entropy else [None] * N
        token_rows, finished = tokens.cpu().tolist(), done.tolist()
        trajs = []
        for i in range(N):
            trajs.append(
                Trajectory(
                    prompt_ids=prompts[i],
                    response_ids=token_rows[i][: sizes[i]],
                    logprobs=row_lp[i],
                    entropy=row_ent[i],
                    finish_reason="stop" if finished[i] else "length",
                    stop_string=matched[i] if stops else None,
                    mm_inputs=row_mm[i // params.n],
                )
            )
        return trajs

    def _mm_to_device(self, mm: dict[str, torch.Tensor] | None
                      ) -> dict[str, torch.Tensor] | None:
        return None if mm is None else {k: v.to(self.device) for k, v in mm.items()}

    def update_weights(self, train_engine: Any) -> None:
        """Rollout and training share one model: nothing to sync."""

    # -- training -------------------------------------------------------------------------------
    def _build_optimizer(self, cfg: Any, total_steps: int) -> None:
        # bf16/fp16 weights: AdamW steps fp32 master copies (as megatron's optimizer does), and
        # the model gets them rounded after each step; stepped in bf16 directly, an update
        # below half a bf16 ulp of its weight (lr 1e-4 against weights ~0.02) rounds away
        self.masters: list[torch.Tensor] | None = None
        if any(p.dtype != torch.float32 for p in self.model.parameters()):
            self.masters = [p.detach().float().clone() for p in self.model.parameters()]
        # fused: one kernel per step instead of ~10 ops per parameter tensor (on the tiny CPU
        # model the per-tensor loop was ~90x slower; the weights agree within 1e-8)
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(
            self.masters or self.model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
            eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None,
        )
        warmup, schedule = cfg.warmup_steps, cfg.schedule

        def factor(step: int) -> float:
            if warmup > 0 and step < warmup:
                return (step + 1) / warmup
            frac = (step - warmup) / max(total_steps - warmup, 1)
            if schedule == "cosine":
                return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
            if schedule == "linear":
                return max(0.0, 1.0 - frac)
            return 1.0

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.grad_clip = cfg.grad_clip

    def forward(
        self, mb: RolloutBatch, temperature: float, with_entropy: bool = True,
        entropy_grad: bool = False, model: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_theta and entropy [B, T] on the response tokens of ``mb``."""
        model = model or self.model
        mb.require("input_ids", "attention_mask", "position_ids", "responses", stage="forward")
        T = mb["responses"].shape[1]
        ids, attn = mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device)
        pos = mb["position_ids"].to(self.device)
        mm = self._mm_to_device(mb.mm_inputs())  # the tensors the rollout sampled with
        if mm is not None:
            mpos = mm_position_ids(model, ids, attn, mm)
            pos = pos if mpos is None else mpos
        logits = None
        if self.shared_prefix and kv_supports(model) and covers_inputs(model, mm):
            logits = shared_prefix_logits(model, ids, attn, pos, T, mm)
        if logits is None:
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                           logits_to_keep=T + 1, **(mm or {})).logits[:, :T]
        return token_logprobs_and_entropy(logits, mb["responses"].to(self.device), temperature,
                                          with_entropy, entropy_grad)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, temperature: float, micro_batch_size: int,
                 reference: bool = False) -> torch.Tensor:
        """No-grad log-probs of the batch under the current (or the reference) model."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs requested but no reference model was kept")
        parts = [self.forward(mb, temperature, with_entropy=False, model=model)[0].cpu()
                 for mb in batch.split(micro_batch_size)]
        return torch.cat(parts)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        """Clip, step, and return the pre-clip gradient norm."""
        assert self.optimizer is not None, "engine built without an optimizer"
        for p in self.model.parameters():  # a step with nothing trained is a zero-gradient step
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        params = list(self.model.parameters())
        if self.masters is not None:  # the gradients move to the fp32 masters
            for p, m in zip(params, self.masters):
                m.grad = None if p.grad is None else p.grad.float()
            self.model.zero_grad(set_to_none=True)
        stepped = self.masters or params
        grad_norm = torch.nn.utils.clip_grad_norm_(stepped, self.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            if self.masters is not None:
                with torch.no_grad():
                    for p, m in zip(params, self.masters):
                        p.copy_(m)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(grad_norm)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer else 0.0

    def train_mode(self, on: bool) -> None:
        self.model.train(on)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.processor is not None:
            self.processor.save_pretrained(path)
        marker = Path(self.model_path) / TOKENIZER_MARKER
        if marker.exists():  # keep the checkpoint loadable with the same tokenizer
            shutil.copy(marker, path / TOKENIZER_MARKER)
        state = {"generator": self.generator.get_state()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
            state["scheduler"] = self.scheduler.state_dict()
            if self.masters is not None:
                state["masters"] = self.masters
        torch.save(state, path / "engine_state.pt")

    def load(self, path: str | Path) -> None:
        path = Path(path)
        loaded = auto_model_class(path).from_pretrained(path, dtype=self.model.dtype)
        self.model.load_state_dict(loaded.state_dict())
        state = torch.load(path / "engine_state.pt", weights_only=False)
        self.generator.set_state(state["generator"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        if self.optimizer is not None and self.masters is not None:  # fp32, not the bf16 copy
            saved = state.get("masters") or [p.detach().float() for p in self.model.parameters()]
            with torch.no_grad():
                for m, value in zip(self.masters, saved):
                    m.copy_(value)
