"""Structured config schema (Hydra + OmegaConf) and its validation.

``conf/config.yaml`` composes the groups ``algorithm/ task/ model/ backend/ trainer/`` on top of
the :class:`Config` schema registered here, so Hydra rejects an unknown key or a wrong type under
``model``, ``backend``, ``trainer``, ``data``, ``rollout`` and ``tracking`` naming the key.
``algorithm`` and ``task`` are open at the schema level because each registered algorithm/task
declares its own knobs; :func:`validate_config` checks them against those declarations before
anything runs. Canonical keys (docs/design.md): ``seed``, ``algorithm``, ``task``, ``model``,
``backend``, ``trainer.steps``, ``trainer.eval_every``, ``data.prompts_per_step``, ``rollout.n``,
``rollout.temperature``, ``rollout.max_new_tokens``, ``tracking.uri``, ``tracking.experiment``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.registry import BACKENDS, MODELS, TASKS
from harness.typed_config import ConfigError, schema_of, validate


def cache_home() -> Path:
    """rlbench's cache root: ``$RLBENCH_CACHE``, else ``~/.cache/rlbench`` (tiny models, the
    MLflow schema template, BM25 indexes, rendered diagrams)."""
    env = os.environ.get("RLBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlbench"


def conf_dir() -> Path:
    """The directory of rlbench's own configs (the repository's ``conf/``), from any working
    directory and any install.

    ``conf/`` is the package ``conf`` (``conf/__init__.py``) whose YAML ships as package data, so
    ``importlib.resources.files("conf")`` finds it after ``pip install .``
    (``site-packages/conf``) as well as in an editable install or a checkout on ``PYTHONPATH``.
    A ``conf`` that is not rlbench's (no ``RLBENCH_CONF`` marker: say a project's own ``conf/``
    package ahead on ``sys.path``), or none at all (an editable install made before ``conf/``
    was a package), falls back to the ``conf`` directory beside the ``harness`` package, which
    is where both layouts put it. Hydra reads the result as a plain directory, so rlbench is
    not run from a zip file. A missing ``config.yaml`` there is reported by the commands that
    need it (``rlbench train``: one line naming this path), not here.
    """
    import importlib
    import importlib.resources

    beside = Path(__file__).resolve().parents[1] / "conf"
    try:
        package = importlib.import_module("conf")
    except ImportError:
        return beside
    if not getattr(package, "RLBENCH_CONF", False):
        return beside
    found = Path(str(importlib.resources.files(package)))
    return found if (found / "config.yaml").is_file() else beside


CONF_DIR = conf_dir()
# model sources built locally from a recipe: their weights never come from ``model.path``
LOCAL_MODEL_SOURCES = ("tiny", "tiny_vlm")


@dataclass
class TinyArchConfig:
    """The tiny default model: a Qwen2 causal LM over a character-level tokenizer."""

    architecture: str = "qwen2"  # qwen2 | llama
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True


@dataclass
class PretrainConfig:
    """Supervised warm-start on the task's reference solutions (``rlbench pretrain``)."""

    steps: int = 200
    batch_size: int = 128
    lr: float = 1.0e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    seed: int = 0
    # Noise prefixes: a share of the warm-start prompts get 1..prefix_max_words random words from
    # prefix_words in front (empty list = off), so that a tiny model tolerates a nonsense prefix
    # the way a pretrained LM does (the LOPE testbed: conf/model/tiny_lorem.yaml).
    prefix_words: list[str] = field(default_factory=list)
    prefix_fraction: float = 0.5
    prefix_max_words: int = 3
    prefix_separator: str = " "


@dataclass
class ModelConfig:
    name: str = "tiny"
    source: str = "tiny"  # tiny: built + warm-started locally; hf: a local dir or hub id in `path`
    path: str | None = None
    task_variant: str = "full"  # the task variant a model of this size is meant for
    cache_dir: str | None = None  # tiny models: where built models live (default ~/.cache/rlbench)
    attn_implementation: str | None = None  # eager | sdpa | flash_attention_2; null: transformers'
    chat_template: str | None = None  # null: the tokenizer's own; a Jinja string replaces it
    arch: TinyArchConfig = field(default_factory=TinyArchConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)


@dataclass
class VLLMBackendConfig:
    """The vLLM rollout engine (harness/backends/vllm_engine.py); GPU only."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.35  # of the GPU's total memory; must be free at start
    enforce_eager: bool = False  # true: no CUDA graphs (faster start, slower decode)
    sleep_level: int = 2  # 0: stay resident; 1: weights to host RAM; 2: drop weights + KV cache
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True  # the n samples of a prompt share its prefill
    load_format: str = "dummy"  # dummy: no checkpoint read; the train engine's weights are pushed
    max_model_len: int | None = None  # null: the model's context length


@dataclass
class MegatronBackendConfig:
    """The megatron-core train engine (harness/backends/megatron_engine.py); GPU only."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1  # > 1 is refused (the trainer drives micro-batches itself)
    sequence_parallel: bool = False  # needs transformer_impl=transformer_engine
    use_distributed_optimizer: bool = True
    grad_reduce_in_fp32: bool = True
    recompute_granularity: str | None = None  # null | full | selective (activation checkpointing)
    transformer_impl: str = "local"  # local (pure PyTorch) | transformer_engine


@dataclass
class BackendConfig:
    name: str = "hf"
    rollout: str = "hf"  # rollout engine (BACKENDS registry)
    train: str = "hf"  # train engine; the same name on both sides shares one model
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "float32"  # float32 | bfloat16 | float16
    threads: int = 0  # torch CPU threads; 0 = leave torch's default
    gen_batch_size: int = 1024  # most sequences generated in one batch
    kv_cache: str = "static"  # hf rollout: static (preallocated) | dynamic (transformers' cache)
    shared_prefix: bool = True  # hf training forward: each distinct prompt run once per micro-batch
    vllm: VLLMBackendConfig = field(default_factory=VLLMBackendConfig)
    megatron: MegatronBackendConfig = field(default_factory=MegatronBackendConfig)


@dataclass
class OptimConfig:
    lr: float = 1.0e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1.0e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine | linear (decay to 0 at trainer.steps)


@dataclass
class RolloutCorrectionConfig:
    """Truncated importance sampling for the rollout/trainer mismatch (harness/
    rollout_correction.py): weights exp(log pi_old - log pi_rollout) per token or per sequence,
    capped (``truncate``) or zeroed above the cap (``mask``), multiplying the policy loss."""

    mode: str = "none"  # none | token_truncate | token_mask | sequence_truncate | sequence_mask
    cap: float = 2.0  # upper bound of the weight (verl's rollout_is_threshold)


@dataclass
class TrainerConfig:
    steps: int = 400
    eval_every: int = 50
    eval_at_start: bool = True
    # evaluate where tokens generated (rollout/tokens_total) is nearest each mark, so equal-
    # compute results are read from an evaluation made at the budget (harness/trainer.py)
    eval_at_tokens: list[int] = field(default_factory=list)
    checkpoint_every: int = 100
    keep_checkpoints: int = 1  # checkpoints left once the run FINISHED (0 = keep every one)
    output_dir: str | None = None  # null: Hydra's run dir (or ./outputs/<run name>)
    # auto: continue this cell's unfinished run from its checkpoint if it left one
    # (harness/cell_plan.py); true: insist on that; false: always start afresh; else a checkpoint
    # dir or an output dir
    resume: str | None = "auto"
    skip_finished: bool = True  # skip the cell when a run with its config hash FINISHED
    mini_batch_size: int = 0  # samples per optimizer step; 0 = the whole batch
    micro_batch_size: int = 0  # samples per forward/backward; 0 = the mini-batch
    epochs: int = 1  # inner PPO epochs over each batch
    shuffle: bool = False  # shuffle samples before splitting into mini-batches
    old_logprobs: str = "recompute"  # recompute (verl) | rollout (trust the sampler's)
    skip_zero_gradient: bool = True  # leave out samples whose loss gradient is exactly zero
    length_bucketing: bool = False  # micro-batches of rows of similar length, each trimmed
    max_wall_s: float | None = None  # stop (cleanly, with a checkpoint) after this many seconds
    status_every: int = 1  # one status line every N steps (0 = off)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class DataConfig:
    """How prompts fit the model (harness/prompts.py; verl's keys of the same names)."""

    prompts_per_step: int = 32
    max_prompt_length: int | None = None  # null: the model's context - the response length
    truncation: str = "error"  # error | left | right | middle: a prompt over the limit
    filter_overlong_prompts: bool = False  # true: drop prompts over the limit instead


@dataclass
class RolloutConfig:
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None  # null: the task's default for its variant
    entropy: bool = True  # record per-token entropy at sampling time


@dataclass
class TrackingConfig:
    uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlruns.db
    experiment: str = "rlbench"
    run_name: str | None = None
    enabled: bool = True
    log_samples: int = 8  # sample rollouts saved (an MLflow table) per evaluation
    log_datasets: bool = True  # train pool and eval sets as MLflow dataset inputs (log_input)
    system_metrics: bool = False  # MLflow's system metrics (CPU, memory, GPU) every 10 s
    log_model: bool = False  # the final weights as the run's artifact "model" (HF format)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Config:
    seed: int = 0
    # the seed label a board pairs this run with (null: ``seed``). An A/A control trains on
    # seeds of its own and is compared with the baseline's run of seed ``block_seed``
    # (docs/analysis.md, Controls); the trainer tags it ``rlbench.seed``, the real seed
    # ``rlbench.train_seed``
    block_seed: int | None = None
    algorithm: Any = None
    task: Any = None
    model: ModelConfig = field(default_factory=ModelConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def _sub(a: Any, b: Any) -> int:
    """``${rlbench.sub:a,b}`` = a - b, for integer keys derived from others in a named sweep
    (Hydra's sweeper crosses its keys and cannot zip two: conf/sweep/
    testbed_offpolicy_control_aa.yaml sets ``block_seed: ${rlbench.sub:${seed},200}``)."""
    return int(a) - int(b)


# registered on import, not in register_schema(): a launcher's worker (joblib, Ray) resolves the
# config in a process that imported harness but never composed one
OmegaConf.register_new_resolver("rlbench.sub", _sub, replace=True)


def check_block_seed(cfg: Any) -> None:
    """``block_seed`` (the LLM loop's and the LANTERN track's configs): null or a seed label
    >= 0; absent from a config saved before the key existed."""
    block = cfg.get("block_seed")
    if block is not None and block < 0:
        raise ConfigError(f"block_seed must be a seed label >= 0 (the baseline's seed this run "
                          f"is paired with) or null, got {block}")


def plugin_searchpath() -> list[str]:
    """Config packages of installed plugins (entry-point group ``rlbench.conf``, values such as
    ``my_plugin.conf``), so a plugin's ``algorithm/<name>.yaml`` joins the config groups."""
    return sorted(f"pkg://{ep.value}" for ep in entry_points(group="rlbench.conf"))


def with_searchpath(overrides: list[str]) -> list[str]:
    paths = plugin_searchpath()
    if not paths or any(o.startswith("hydra.searchpath") for o in overrides):
        return overrides
    return [*overrides, f"hydra.searchpath=[{','.join(paths)}]"]


def compose_config(overrides: list[str], return_hydra_config: bool = False) -> Any:
    """The resolved config for ``overrides`` through Hydra's compose API (no run dir)."""
    from hydra import compose, initialize_config_dir

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=with_searchpath(overrides),
                       return_hydra_config=return_hydra_config)


def register_schema() -> None:
    """Make ``rlbench_schema`` available to ``conf/config.yaml``'s defaults list."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rlbench_schema", node=Config)
    from harness.sweeper import register

    register()  # hydra/sweeper=compatible: a sweep of the compatible pairs only


_CHOICES = {
    "trainer.old_logprobs": ("recompute", "rollout"),
    "trainer.optim.schedule": ("constant", "cosine", "linear"),
    "backend.dtype": ("float32", "bfloat16", "float16"),
    "backend.kv_cache": ("static", "dynamic"),
    "model.arch.architecture": ("qwen2", "llama"),
    "trainer.rollout_correction.mode": ("none", "token_truncate", "token_mask",
                                        "sequence_truncate", "sequence_mask"),
    "backend.vllm.sleep_level": (0, 1, 2),
    "data.truncation": ("error", "left", "right", "middle"),
    "backend.megatron.transformer_impl": ("local", "transformer_engine"),
    "backend.megatron.recompute_granularity": (None, "full", "selective"),
}


@dataclass
class RunParts:
    """The task and the algorithm of one run, built (and so validated) once by
    :func:`validate_config`; the trainer, ``rlbench eval`` and ``rlbench pretrain`` use them."""

    task: Any  # harness.task.Task
    algorithm: Any  # harness.algorithm.Algorithm


def validate_config(cfg: DictConfig, *, hardware: bool = True) -> RunParts:
    """Check everything Hydra's schema cannot: enumerations, names in registries, and the
    algorithm's and task's own knobs, by building the task and the algorithm (each component
    checks its own knobs where it is built). Fills ``rollout.max_new_tokens`` with the task's
    default when it is null. Returns what it built; raises :class:`ConfigError` naming the key.
    ``hardware=False`` leaves out what this machine must have (a CUDA GPU for a GPU backend):
    for a config that is only printed (``--cfg job``), e.g. a GPU sweep checked on a laptop."""
    from harness.algorithm import AlgorithmConfig, build_algorithm
    from harness.typed_config import build

    for key, valid in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not one of: {', '.join(valid)}")
    for key, registry in (("model.source", MODELS), ("backend.rollout", BACKENDS),
                          ("backend.train", BACKENDS)):
        name = OmegaConf.select(cfg, key)
        if name not in registry:
            raise ConfigError(f"{key}: {registry._unknown_message(name)}")
        engine = BACKENDS.get(name) if registry is BACKENDS else None
        if hardware and engine is not None and engine.requires_cuda:
            import torch

            cpu_mode = cfg.backend.device == "cpu" and engine.cpu_mode
            if not torch.cuda.is_available() and not cpu_mode:
                raise ConfigError(f"{key}={name!r} needs a CUDA GPU and none is visible; "
                                  "on this machine use backend=hf")
    if cfg.model.source in LOCAL_MODEL_SOURCES and cfg.model.path:
        raise ConfigError(
            f"model.path={cfg.model.path!r} is not read by model={cfg.model.name} (source "
            f"{cfg.model.source!r}: built locally): to train the model at that path, add "
            "model=hf")
    for key in ("trainer.steps", "data.prompts_per_step", "rollout.n", "trainer.epochs",
                "data.max_prompt_length"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 1:  # data.max_prompt_length may be null
            raise ConfigError(f"{key} must be >= 1, got {value}")
    check_block_seed(cfg)
    if cfg.rollout.temperature <= 0:
        raise ConfigError(f"rollout.temperature must be > 0, got {cfg.rollout.temperature}")
    if cfg.trainer.rollout_correction.cap <= 0:
        raise ConfigError("trainer.rollout_correction.cap must be > 0")
    if cfg.trainer.eval_every < 0:
        raise ConfigError("trainer.eval_every must be >= 0 (0 = never)")
    marks = list(cfg.trainer.eval_at_tokens or [])
    if any(not isinstance(m, int) or m <= 0 for m in marks) or marks != sorted(set(marks)):
        raise ConfigError(f"trainer.eval_at_tokens must be increasing positive token counts "
                          f"(tokens generated), e.g. [50000,100000]; got {marks}")
    # algorithm: its bundle and every building block
    if not isinstance(cfg.algorithm, DictConfig) or "name" not in cfg.algorithm:
        raise ConfigError("algorithm must be chosen, e.g. algorithm=grpo")
    from harness.registry import ALGORITHMS

    ALGORITHMS.get(cfg.algorithm.name)
    validate(AlgorithmConfig, cfg.algorithm, "algorithm")
    if not isinstance(cfg.task, DictConfig) or "name" not in cfg.task:
        raise ConfigError("task must be chosen, e.g. task=countdown")
    validate(schema_of(TASKS.get(cfg.task.name)), cfg.task, "task")
    from harness.compat import check_config

    task = build(TASKS, cfg.task, "task")
    from harness.models import check_model_for_task

    check_model_for_task(cfg.model, cfg.task, local_files=hardware)
    resolve_defaults(cfg, task)
    algorithm = build_algorithm(cfg.algorithm, cfg.rollout.max_new_tokens)
    check_config(cfg)  # the pair: what the algorithm's parts need, what the task offers
    return RunParts(task, algorithm)


def resolve_defaults(cfg: DictConfig, task: Any) -> None:
    """The keys whose default comes from the task: ``rollout.max_new_tokens`` (null: the
    task's ``default_max_new_tokens``)."""
    if cfg.rollout.max_new_tokens is None:
        cfg.rollout.max_new_tokens = task.default_max_new_tokens


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values), for MLflow params."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    out: dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not node and prefix:
            out[prefix[:-1]] = "{}"
        return out
    out[prefix[:-1]] = node
    return out
