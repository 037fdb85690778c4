"""The RL training loop (docs/design.md, "The data flow of one training step").

    batch = algorithm.rollout(ctx)                  time/gen, time/reward
    batch["old_logprobs"] = engine.logprobs(batch)  time/old_logprob   (verl recomputes)
    batch["ref_logprobs"] = ...                     time/ref           (only with a KL term)
    algorithm.compute_advantages(batch)             time/adv
    for epoch, mini-batch, micro-batch:             time/update
        logp, entropy = engine.forward(micro)
        loss, metrics = algorithm.loss(micro, logp, entropy, aggregator(mini-batch))
        engine.backward(loss)
      engine.optimizer_step()
    rollout_engine.update_weights(train_engine)
    tracker.log(step metrics) ; every eval_every steps: evaluate()      time/eval
Equal-compute evaluations (``trainer.eval_at_tokens``): harness/evaluation.py ``at_marks``.

A first Ctrl-C or SIGTERM asks the loop to stop at the end of the current step: it writes a
checkpoint, marks the MLflow run KILLED and raises :class:`RunInterrupted`; a second signal
stops at once (the last periodic checkpoint stays on disk). Before training, the cell's config
hash is looked up in MLflow (:mod:`harness.cells`): a cell that already FINISHED is skipped, and
an unfinished one (killed, failed, or SIGKILLed while RUNNING) continues from its last checkpoint
into the same MLflow run and output dir. The checkpoint holds everything the loop's randomness
depends on (weights, optimizer, scheduler, the sampling generator, the Python / NumPy / torch RNGs,
the prompt sampler's position), so a resumed run logs the same metrics as an uninterrupted one.

Cost ledger (summary metrics, for compute-matched comparisons): ``final/tokens_total``
(generated), ``final/tokens_trained`` (response tokens that went through a backward pass),
``final/time_<stage>_s`` (wall seconds per stage over the run), ``final/peak_mem_mb`` (peak
resident memory of the process) and, on a GPU, ``final/peak_gpu_mem_mb``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.algorithm import Algorithm, build_algorithm
from harness.batch import RolloutBatch
from harness.cells import HASH_TAG, CellPlan, plan_cell
from harness.checkpoint import (
    prune_checkpoints,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    seed_everything,
)
from harness.components import ConfigError, build
from harness.config import validate_config
from harness.evaluation import at_marks, check_eval_sets, evaluate
from harness.lifecycle import (
    RunInterrupted,
    eval_line,
    eval_summary,
    finish_text,
    install_handlers,
    peak_rss_mb,
    restore_handlers,
    status_line,
)
from harness.manifest import build_manifest, git_label
from harness.prompts import fit_data
from harness.registry import BACKENDS, MODELS, TASKS
from harness.rollout import PromptSampler, RolloutContext, on_policy_rows, rollout_metrics
from harness.rollout_correction import apply_rollout_correction
from harness.task import Task
from harness.tracking import Tracker
from harness.types import SamplingParams

log = logging.getLogger("rlbench")


def process_rank() -> int:
    """Global rank under torchrun (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


class Trainer:
    def __init__(self, cfg: DictConfig, output_dir: str | Path | None = None) -> None:
        validate_config(cfg)
        self.cfg = cfg
        self.task: Task = build(TASKS, cfg.task, "task")
        if cfg.rollout.max_new_tokens is None:
            cfg.rollout.max_new_tokens = self.task.default_max_new_tokens
        self.algorithm: Algorithm = build_algorithm(cfg.algorithm, cfg.rollout.max_new_tokens)
        self.run_name = cfg.tracking.run_name or (
            f"{cfg.algorithm.name}-{cfg.task.name}-{cfg.model.name}-s{cfg.seed}"
        )
        self.output_dir = Path(
            cfg.trainer.output_dir or output_dir
            or Path("outputs") / f"{self.run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        self.step = 0
        self.tokens_total = 0.0
        self.tokens_trained = 0.0
        self.stage_totals: dict[str, float] = defaultdict(float)
        self.peak_mem_mb = 0.0
        self.wall_offset = 0.0
        self.warm_start_s = 0.0  # resolving (building, warm-starting) the model: not wall_s
        self.last_checkpoint: Path | None = None
        self._t_start = time.perf_counter()  # fit() restarts it; setup() moves it past the
        self._first_step = 0                 # warm start
        self.plan: CellPlan | None = None
        self.eval_history: list[dict[str, float]] = []
        self._eval_after_step = False  # a token mark wants the policy after this step's update
        self._stop_signal: int | None = None

    # -- setup ----------------------------------------------------------------------------------
    def setup(self) -> CellPlan:
        """Plan the cell; unless it is skipped, build everything and open the MLflow run."""
        cfg = self.cfg
        # under torchrun only rank 0 logs (every rank trains the same cell)
        self.tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment,
                               cfg.tracking.enabled and process_rank() == 0)
        self.plan = plan_cell(cfg, self.tracker.client if self.tracker.enabled else None,
                              self.tracker.experiment_id if self.tracker.enabled else None,
                              self.tracker.uri)
        if self.plan.action in ("skip", "busy"):
            return self.plan
        if self.plan.output_dir is not None:  # keep writing where the run started
            self.output_dir = self.plan.output_dir
        seed_everything(cfg.seed)
        if cfg.backend.threads > 0:
            torch.set_num_threads(cfg.backend.threads)
        if cfg.trainer.eval_every > 0:
            check_eval_sets(self.task)
        t0 = time.perf_counter()
        self.model_path = MODELS.get(cfg.model.source)(cfg.model, self.task)
        self.warm_start_s = time.perf_counter() - t0
        self._t_start += self.warm_start_s  # the run's own wall time starts after it
        self.separate_engines = cfg.backend.rollout != cfg.backend.train
        if self.separate_engines:
            # the rollout engine first: vLLM sizes its memory from what is free when it starts
            rollout_cls = BACKENDS.get(cfg.backend.rollout)
            if not getattr(rollout_cls, "receives_weights", False):
                raise ConfigError(
                    f"backend.rollout={cfg.backend.rollout!r} cannot take weights from "
                    f"backend.train={cfg.backend.train!r}; use the same engine for both")
            self.rollout_engine = rollout_cls(self.model_path, cfg.backend, cfg.seed)
        engine_cls = BACKENDS.get(cfg.backend.train)
        self.engine = engine_cls(self.model_path, cfg.backend, cfg.seed, cfg.trainer.optim,
                                 total_steps=cfg.trainer.steps,
                                 need_reference=self.algorithm.needs_reference,
                                 attn_implementation=cfg.model.attn_implementation)
        if self.separate_engines:
            self.rollout_engine.update_weights(self.engine)  # it starts without real weights
        else:
            self.rollout_engine = self.engine
        if cfg.model.chat_template:  # the model config's template replaces the tokenizer's
            for engine in {id(self.engine): self.engine, id(self.rollout_engine):
                           self.rollout_engine}.values():
                engine.tokenizer.chat_template = cfg.model.chat_template
        # every prompt checked against the model before anything trains (harness/prompts.py)
        data = fit_data(cfg, self.rollout_engine, self.model_path, self.task,
                        evals=cfg.trainer.eval_every > 0 or bool(cfg.trainer.eval_at_tokens))
        self.eval_sets = data.eval_sets
        self.sampler = PromptSampler(data.train, cfg.seed)
        self.sampling = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
            entropy=cfg.rollout.entropy,
        )
        resume_state = self._load_resume(self.plan) if self.plan.action == "resume" else None
        tags = {
            "rlbench.algorithm": cfg.algorithm.name, "rlbench.task": cfg.task.name,
            "rlbench.task_variant": str(cfg.task.get("variant", "")),
            "rlbench.model": cfg.model.name, "rlbench.seed": str(cfg.seed),
            "rlbench.backend": cfg.backend.name,
            "rlbench.temperature": str(cfg.rollout.temperature),
            "rlbench.output_dir": str(self.output_dir.resolve()),
            HASH_TAG: self.plan.config_hash, "rlbench.kind": "train",
            "rlbench.git_commit": git_label(),  # the code the run was made with
            **{k: str(v) for k, v in cfg.tracking.tags.items()},
        }
        self.tracker.start(self.run_name, tags, run_id=self.plan.run_id)
        if self.plan.claim is not None:
            self.plan.claim.note_run(self.tracker.run_id)
        if resume_state is None:
            self.tracker.log_params(cfg)
            manifest = build_manifest(cfg, self.task.dataset_hash(), self.model_path)
            self.tracker.log_json(manifest, "manifest.json")
            self.tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
            self.tracker.log_metrics(data.metrics, 0)
            if cfg.tracking.log_datasets:
                self.tracker.log_datasets(self.task, data.train, data.eval_sets)
        if cfg.tracking.system_metrics:
            self.tracker.start_system_metrics()
        log.info("[%s] run %s, MLflow %s, output %s", self.run_name, self.tracker.run_id,
                 self.tracker.uri if self.tracker.enabled else "off", self.output_dir)
        return self.plan

    def _load_resume(self, plan: CellPlan) -> dict[str, Any]:
        path = plan.checkpoint
        state = json.loads((path / "trainer_state.json").read_text())
        self.engine.load(path)
        if self.separate_engines:
            self.rollout_engine.update_weights(self.engine)
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.tokens_total = state["step"], state["tokens_total"]
        self.tokens_trained = state.get("tokens_trained", 0.0)
        self.stage_totals.update(state.get("stage_totals", {}))
        self.peak_mem_mb = state.get("peak_mem_mb", 0.0)
        self.wall_offset = state.get("wall_s", 0.0)
        self.eval_history = state.get("eval_history", [])
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        restore_rng_state(state)
        if plan.run_id is None:
            plan.run_id = state.get("run_id")
        log.info("[%s] resuming %s: from step %d", self.run_name, plan.reason, self.step)
        return state

    # -- one step -------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        cfg, eng = self.cfg, self.engine
        t_step = time.perf_counter()
        ctx = RolloutContext(engine=self.rollout_engine, task=self.task,
                             draw_prompts=self.sampler.draw,
                             prompts_per_step=cfg.data.prompts_per_step, sampling=self.sampling,
                             shape_rewards=self.algorithm.shape_rewards)
        batch = self.algorithm.rollout(ctx)
        if self.separate_engines and hasattr(self.rollout_engine, "sleep"):
            self.rollout_engine.sleep()  # hand the GPU memory to training
        timings = {f"time/{k}": v for k, v in ctx.timings.items()}
        metrics: dict[str, float] = dict(ctx.metrics)
        before = self.tokens_total
        self.tokens_total += metrics.get("rollout/tokens", 0.0)
        metrics["rollout/tokens_total"] = self.tokens_total
        self._eval_at_marks(before, self.tokens_total)
        if len(batch) > 0:
            micro = cfg.trainer.micro_batch_size or cfg.trainer.mini_batch_size or len(batch)
            t0 = time.perf_counter()
            batch["old_logprobs"] = self.old_logprobs(batch, micro)
            timings["time/old_logprob"] = time.perf_counter() - t0
            metrics.update(self.rollout_correction(batch))
            if self.algorithm.needs_reference:
                t0 = time.perf_counter()
                batch["ref_logprobs"] = eng.logprobs(batch, cfg.rollout.temperature, micro,
                                                     reference=True)
                timings["time/ref"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            metrics.update(self.algorithm.compute_advantages(batch))
            batch, selected = self.algorithm.select_training_rows(batch)
            metrics.update(selected)
            timings["time/adv"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            metrics.update(self.update(batch, old_is_current=True))
            timings["time/update"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.rollout_engine.update_weights(eng)
            if self.separate_engines:
                timings["time/sync"] = time.perf_counter() - t0
        metrics.update(rollout_metrics(batch, cfg.rollout.temperature))
        metrics["actor/lr"] = eng.lr
        timings["time/step"] = time.perf_counter() - t_step
        return {**metrics, **timings}

    def old_logprobs(self, batch: RolloutBatch, micro: int) -> torch.Tensor:
        """log pi_old of every row at the training temperature. ``recompute`` runs the train
        engine; ``rollout`` reuses the sampler's log-probs where they are that quantity (same
        fp32 model, sampled at the training temperature) and recomputes the rows sampled at
        another temperature (arbitrary-entropy's side batch). Off-policy rows (``is_offpolicy``:
        sampled from a different prompt, as LOPE's) keep their behaviour log-probs in both
        modes: recomputing them on the training prompt would erase the correction."""
        train_t = self.cfg.rollout.temperature
        if self.separate_engines:
            # another engine sampled: its log-probs are not this engine's pi_old (kernels,
            # precision), so recompute whatever trainer.old_logprobs says; the entropy vLLM does
            # not report comes from the same pass
            want_entropy = self.cfg.rollout.entropy and "entropy" not in batch
            old, entropy = self._recompute(batch, train_t, micro, want_entropy)
            if entropy is not None:
                batch["entropy"] = entropy
        elif self.cfg.trainer.old_logprobs == "recompute":
            old = self.engine.logprobs(batch, train_t, micro)
        else:
            old = batch["rollout_logprobs"].clone()
            stale = (~on_policy_rows(batch, train_t) & ~batch["is_offpolicy"]).nonzero().flatten()
            if len(stale):
                sub = batch.select(stale).trim_padding()
                width = sub["responses"].shape[1]
                old[stale] = 0.0
                old[stale, :width] = self.engine.logprobs(sub, train_t, micro)
        off = batch["is_offpolicy"]
        old[off] = batch["rollout_logprobs"][off]
        return old

    @torch.no_grad()
    def _recompute(self, batch: RolloutBatch, temperature: float, micro: int, with_entropy: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad log pi_old (and entropy) [B, T] from the train engine."""
        logps, ents = [], []
        for mb in batch.split(micro):
            logp, ent = self.engine.forward(mb, temperature, with_entropy=with_entropy)
            logps.append(logp.float().cpu())
            if ent is not None:
                ents.append(ent.float().cpu())
        return torch.cat(logps), (torch.cat(ents) if with_entropy else None)

    def rollout_correction(self, batch: RolloutBatch) -> dict[str, float]:
        """Mismatch metrics between the sampler's and the trainer's log-probs of the on-policy
        rows (when they were recomputed), and truncated-IS weights when
        ``trainer.rollout_correction.mode`` is on (harness/rollout_correction.py)."""
        cfg = self.cfg.trainer
        return apply_rollout_correction(
            batch, on_policy_rows(batch, self.cfg.rollout.temperature),
            recomputed=self.separate_engines or cfg.old_logprobs == "recompute",
            mode=cfg.rollout_correction.mode, cap=cfg.rollout_correction.cap)

    def update(self, batch: RolloutBatch, old_is_current: bool = False) -> dict[str, float]:
        """Epochs x mini-batches x micro-batches over ``batch``. ``old_is_current``: its
        ``old_logprobs`` are the current weights' (true right after rollout in ``train_step``),
        so a preparation pass before the first optimizer step can reuse them."""
        cfg = self.cfg.trainer
        sums: dict[str, float] = defaultdict(float)
        optimizer_steps = 0
        entropy_grad = self.algorithm.config.entropy_coef != 0
        for _ in range(cfg.epochs):
            order = torch.randperm(len(batch)) if cfg.shuffle else torch.arange(len(batch))
            for mb in batch.select(order).split(cfg.mini_batch_size):
                for k, v in self.algorithm.prepare_minibatch(
                        mb, functools.partial(self._current_logprobs,
                                              old_is_current and optimizer_steps == 0)).items():
                    sums[k] += v  # mini-batch metrics (whole-group quantities)
                agg = self.algorithm.aggregator(mb)
                rows = self.algorithm.gradient_rows(mb) if cfg.skip_zero_gradient else None
                if rows is not None:
                    sums["actor/trained_frac"] += float(rows.float().mean())
                    mb = mb.select(rows.nonzero().squeeze(-1)).trim_padding()
                    agg.metric_tokens = float(mb["response_mask"].sum())
                for micro in self._micro_batches(mb):
                    logp, entropy = self.engine.forward(micro, self.cfg.rollout.temperature,
                                                        entropy_grad=entropy_grad)
                    loss, m = self.algorithm.loss(micro.to(logp.device), logp, entropy, agg)
                    self.engine.backward(loss)
                    sums["actor/tokens_trained"] += float(micro["response_mask"].sum())
                    for k, v in m.items():  # micro-batch metrics are additive shares
                        sums[k] += v
                grad_norm = self.engine.optimizer_step()  # before clipping
                sums["actor/grad_norm"] += grad_norm
                sums["actor/grad_clipped_frac"] += float(grad_norm > cfg.optim.grad_clip)
                optimizer_steps += 1
        out = {k: v / max(optimizer_steps, 1) for k, v in sums.items()}
        out["actor/tokens_trained"] = sums["actor/tokens_trained"]  # a count, not a mean
        return out

    def _micro_batches(self, mb: RolloutBatch) -> list[RolloutBatch]:
        """``trainer.length_bucketing``: rows of similar length together (RolloutBatch.
        bucketed_split), unless the loss couples a micro-batch's rows (AEPO's z-score)."""
        size = self.cfg.trainer.micro_batch_size
        if self.cfg.trainer.get("length_bucketing", False) and not getattr(
                self.algorithm.policy_loss, "micro_batch_coupled", False):
            return mb.bucketed_split(size)
        return list(mb.split(size))

    def _current_logprobs(self, old_is_current: bool, mb: RolloutBatch) -> torch.Tensor:
        """No-grad log pi_theta of ``mb`` for a mini-batch preparation pass. Before the first
        optimizer step after rollout, theta is still the policy that produced ``old_logprobs``
        (recomputed by this engine, or the sampler's own with the shared model), so those are
        returned instead of a second forward over the same weights."""
        if old_is_current and not bool(mb["is_offpolicy"].any()):
            return mb["old_logprobs"]
        return self.engine.logprobs(mb, self.cfg.rollout.temperature,
                                    self.cfg.trainer.micro_batch_size)

    # -- evaluation, checkpoints, the loop ------------------------------------------------------
    def _eval_at_marks(self, before: float, after: float) -> None:
        """Step ``self.step + 1``'s rollouts took tokens generated from ``before`` to ``after``:
        evaluate now (the policy trained on ``before`` tokens, logged at ``self.step``) for each
        crossed mark nearer ``before``; flag an evaluation after the update for the others."""
        now, self._eval_after_step = at_marks(self.cfg.trainer.eval_at_tokens, before, after)
        if now and not self._evaluated(self.step):
            self._status(self.run_eval(), is_eval=True)

    def _evaluated(self, step: int) -> bool:
        return any(e["step"] == step for e in self.eval_history)

    def run_eval(self) -> dict[str, float]:
        metrics, samples, problems = evaluate(
            self.rollout_engine, self.task, self.cfg.seed, self.step,
            samples_to_keep=self.cfg.tracking.log_samples,
            desc=f"[{self.run_name}] eval step {self.step}", sets=self.eval_sets)
        self.eval_history.append({"step": self.step, **metrics})
        self.stage_totals["eval"] += metrics.get("time/eval", 0.0)
        self.tracker.log_metrics(metrics, self.step)
        if samples:
            self.tracker.log_table(samples, f"samples/eval_step_{self.step:06d}.json")
        # per-problem correct counts: problem-level errors and noise can be recomputed later
        self.tracker.log_jsonl(problems, f"evals/step_{self.step:06d}.jsonl")
        return metrics

    def save(self) -> Path:
        state = {
            "step": self.step, "tokens_total": self.tokens_total,
            "tokens_trained": self.tokens_trained, "stage_totals": dict(self.stage_totals),
            "peak_mem_mb": self._peak_mem(),
            "sampler": self.sampler.state_dict(), "run_id": self.tracker.run_id,
            "wall_s": self.wall_offset + (time.perf_counter() - self._t_start),
            "eval_history": self.eval_history,
            "config": OmegaConf.to_container(self.cfg, resolve=True),  # for rlbench eval
            "algorithm": self.algorithm.state_dict(), **rng_state(),
        }
        self.last_checkpoint = save_checkpoint(self.engine, self.output_dir, self.step, state)
        return self.last_checkpoint

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("[%s] signal %d: stopping after this step (send again to stop at once)",
                    self.run_name, signum)

    def fit(self) -> dict[str, float]:
        """Run (or continue) training; returns the summary metrics."""
        self._t_start = time.perf_counter()
        handlers = install_handlers(self._request_stop)
        status = "FAILED"
        try:
            if self.setup().action in ("skip", "busy"):
                status = "SKIPPED"
                log.info("[%s] skipped: %s", self.run_name, self.plan.reason)
                return self.tracker.summary_of(self.plan.run_id) if self.plan.run_id else {}
            summary = self._loop()
            status = "FINISHED"
            self._finish(summary)
            return summary
        except (KeyboardInterrupt, RunInterrupted) as exc:
            status = "KILLED"
            if isinstance(exc, KeyboardInterrupt):
                raise RunInterrupted(signal.SIGINT) from None
            raise
        finally:
            restore_handlers(handlers)
            try:
                if hasattr(self, "tracker") and status != "SKIPPED":
                    self.tracker.end(status, self.output_dir / "logged.json")
            finally:  # the cell is given up whatever happened above
                if self.plan is not None:
                    self.plan.release()

    def _loop(self) -> dict[str, float]:
        cfg = self.cfg.trainer
        self._first_step = self.step
        if self.step == 0 and cfg.eval_at_start and cfg.eval_every > 0:
            self._status(self.run_eval(), is_eval=True)
        while self.step < cfg.steps:
            if self.plan is not None and self.plan.lost():
                raise RuntimeError(f"cell {self.plan.config_hash} was taken over by another "
                                   "process (this one was presumed gone): stopped")
            metrics = self.train_step()
            self.step += 1
            self.tokens_trained += metrics.get("actor/tokens_trained", 0.0)
            metrics["actor/tokens_trained_total"] = self.tokens_trained
            for key, seconds in metrics.items():
                if key.startswith("time/") and key != "time/step":
                    self.stage_totals[key[len("time/"):]] += seconds
            wall = self.wall_offset + time.perf_counter() - self._t_start
            metrics["time/wall"] = wall
            self.tracker.log_metrics(metrics, self.step)
            if cfg.status_every and self.step % cfg.status_every == 0:
                self._status(metrics)
            last = self.step == cfg.steps or (cfg.max_wall_s and wall >= cfg.max_wall_s)
            due = cfg.eval_every > 0 and (self.step % cfg.eval_every == 0 or last)
            if (due or self._eval_after_step) and not self._evaluated(self.step):
                self._status(self.run_eval(), is_eval=True)
            self._eval_after_step = False
            if self._stop_signal is not None:
                path = self.save()
                log.warning("[%s] checkpoint written to %s", self.run_name, path)
                raise RunInterrupted(self._stop_signal)
            if cfg.checkpoint_every > 0 and (self.step % cfg.checkpoint_every == 0 or last):
                self.save()
            if last:
                break
        return self._summary()

    def _summary(self) -> dict[str, float]:
        """final/* = the last evaluation (the trained model); start/* = the step-0 evaluation."""
        summary: dict[str, float] = {"final/steps": float(self.step),
                                     "final/tokens_total": self.tokens_total,
                                     "final/tokens_trained": self.tokens_trained,
                                     "final/peak_mem_mb": self._peak_mem(),
                                     "final/wall_s": self.wall_offset + time.perf_counter()
                                     - self._t_start,
                                     "final/warm_start_s": self.warm_start_s}
        summary.update({f"final/time_{k}_s": v for k, v in sorted(self.stage_totals.items())})
        if torch.cuda.is_available():
            summary["final/peak_gpu_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        summary.update(eval_summary(self.eval_history))
        self.tracker.log_metrics(summary, self.step)
        return summary

    def _peak_mem(self) -> float:
        """Peak resident memory in MiB, the max over resumes."""
        self.peak_mem_mb = max(self.peak_mem_mb, peak_rss_mb())
        return self.peak_mem_mb

    def _finish(self, summary: dict[str, float]) -> None:
        """After FINISHED: the final model logged on request, old checkpoints dropped, and the
        end-of-run summary (what to look at next)."""
        cfg = self.cfg
        if self.last_checkpoint is None and cfg.tracking.log_model:
            self.save()
        if cfg.tracking.log_model and self.last_checkpoint is not None:
            self.tracker.log_model_dir(self.last_checkpoint)
        if cfg.trainer.keep_checkpoints > 0:
            prune_checkpoints(self.output_dir, cfg.trainer.keep_checkpoints)
        log.info(finish_text(
            self.run_name, summary, self.warm_start_s,
            run_id=self.tracker.run_id if self.tracker.enabled else None, uri=self.tracker.uri,
            experiment=cfg.tracking.experiment, output_dir=self.output_dir,
            checkpoint=self.last_checkpoint))

    def _status(self, m: dict[str, float], is_eval: bool = False) -> None:
        if is_eval:
            log.info(eval_line(self.run_name, self.step, m))
            return
        # ETA from this process's pace (evaluations included), not from a resumed run's start
        done = self.step - self._first_step
        elapsed = time.perf_counter() - self._t_start
        eta = elapsed / done * (self.cfg.trainer.steps - self.step) if done > 0 else 0.0
        log.info(status_line(self.run_name, self.step, self.cfg.trainer.steps, m, eta))


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, float]:
    return Trainer(cfg, output_dir).fit()
