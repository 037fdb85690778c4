"""The tiny default model: a real transformers causal LM small enough to RL-train on a CPU.

* Tokenizer: character level, built with ``tokenizers`` (a WordLevel model over the 95
  printable ASCII characters and newline, one token per character, plus <pad> <bos> <eos>
  <unk>), wrapped as a ``PreTrainedTokenizerFast``.
* Model: ``Qwen2ForCausalLM`` (or ``LlamaForCausalLM``) from ``model.arch``; the default
  (hidden 128, 3 layers, 4 heads, MLP 512, tied embeddings) has about 0.8 M parameters (801,280).
* Warm start: :func:`harness.models.pretrain.supervised_warmstart` on the task's reference
  solutions, then ``save_pretrained`` into a cache directory keyed by a hash of everything that
  determines the weights (architecture, tokenizer, pretraining recipe, the warm-start data).
  Runs load it through ``from_pretrained``, the same path as a real model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from harness.task import Task

TOKENIZER_VERSION = "char-ascii-v1"
TOKENIZER_MARKER = "rlbench_tokenizer.json"
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def build_char_tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved with a model. ``AutoTokenizer`` in transformers 5 picks the
    tokenizer class from the model type (a Qwen2 config gets ``Qwen2Tokenizer``, whose byte-level
    pre-tokenizer would silently drop the spaces of the character tokenizer), so a directory
    marked as holding rlbench's tokenizer is loaded from its ``tokenizer.json`` as saved."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (Path(path) / TOKENIZER_MARKER).exists():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def save_tokenizer(tokenizer: Any, path: str | Path) -> None:
    tokenizer.save_pretrained(path)
    (Path(path) / TOKENIZER_MARKER).write_text(json.dumps({"version": TOKENIZER_VERSION}))


def build_tiny_model(arch: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        Qwen2Config,
    )

    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch.architecture]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def cache_root(model_cfg: Any) -> Path:
    if model_cfg.cache_dir:
        return Path(model_cfg.cache_dir).expanduser()
    env = os.environ.get("RLBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlbench"


def tiny_model_key(model_cfg: Any, task: Task, pairs: list[tuple[Any, str]]) -> str:
    h = hashlib.sha256()
    recipe = {
        "arch": OmegaConf.to_container(OmegaConf.structured(model_cfg.arch)),
        "pretrain": OmegaConf.to_container(OmegaConf.structured(model_cfg.pretrain)),
        "tokenizer": TOKENIZER_VERSION,
        "task": task.name,
        "variant": getattr(task.config, "variant", ""),
    }
    h.update(json.dumps(recipe, sort_keys=True).encode())
    for example, completion in pairs:
        h.update(json.dumps([example.prompt, completion], default=str).encode())
    return h.hexdigest()[:16]


def resolve_tiny(model_cfg: Any, task: Task, progress: bool = True, force: bool = False) -> str:
    """Return the path of the warm-started tiny model for ``task``, building it if needed."""
    pairs = task.warmstart_examples()

    def build() -> tuple[Any, Any]:
        tokenizer = build_char_tokenizer()
        return build_tiny_model(model_cfg.arch, tokenizer, model_cfg.pretrain.seed), tokenizer

    return warm_start_cached(model_cfg, task, pairs, tiny_model_key(model_cfg, task, pairs),
                             build, progress, force)


def warm_start_cached(model_cfg: Any, task: Task, pairs: list[tuple[Any, str]], key: str,
                      build: Callable[[], tuple[Any, Any]], progress: bool = True,
                      force: bool = False, encode_prompt: Callable[..., Any] | None = None
                      ) -> str:
    """The cache directory ``<name>-<task>-<variant>-<key>`` of a locally built model: when
    missing (or ``force``), ``build() -> (model, tokenizer)``, warm-start it on ``pairs`` (a
    vision-language model's prompts encoded by its ``encode_prompt``) and
    save it in Hugging Face format."""
    from harness.models.pretrain import supervised_warmstart

    variant = getattr(task.config, "variant", "")
    target = cache_root(model_cfg) / "models" / f"{model_cfg.name}-{task.name}-{variant}-{key}"
    if (target / "config.json").exists() and not force:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build()
    report = supervised_warmstart(model, tokenizer, pairs, model_cfg.pretrain, progress=progress,
                                  encode_prompt=encode_prompt)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    model.save_pretrained(tmp)
    save_tokenizer(tokenizer, tmp)
    (tmp / "rlbench_pretrain.json").write_text(json.dumps({"key": key, **report}, indent=2))
    if force and target.exists():
        shutil.rmtree(target)
    try:
        tmp.rename(target)  # atomic: a parallel job building the same model loses the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)

