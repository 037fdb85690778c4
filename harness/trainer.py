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
hash is looked up in MLflow (:mod:`harness.cell_plan`): a cell that already FINISHED is skipped, and
an unfinished one (killed, failed, or SIGKILLed while RUNNING) continues from its last checkpoint
into the same MLflow run and output dir. The checkpoint holds everything the loop's randomness
depends on (weights, optimizer, scheduler, the sampling generator, the Python / NumPy / torch RNGs,
the prompt sampler's position), so a resumed run logs the same metrics as an uninterrupted one:
:meth:`Trainer.resumables` is the one table of what is saved and how each part is restored.

Where the rest lives: the cost ledger and the loop state (:mod:`harness.ledger`), the summary rule
(``final/*`` = the last evaluation; :mod:`harness.summary`), status lines and signal handling
(:mod:`harness.run_status`), what to do with a cell that already ran (:mod:`harness.cell_plan`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.algorithm import Algorithm
from harness.batch import RolloutBatch
from harness.cell_plan import CellPlan, plan_cell
from harness.checkpoint import (
    prune_checkpoints,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    seed_everything,
)
from harness.config import RunParts, resolve_defaults, validate_config
from harness.engines import RolloutEngine, TrainEngine, build_engines
from harness.evaluation import at_marks, check_eval_sets, evaluate
from harness.ledger import LoopState, timed, upgrade_state
from harness.manifest import build_manifest
from harness.prompts import fit_data
from harness.registry import MODELS
from harness.rollout import PromptSampler, RolloutContext, on_policy_rows, rollout_metrics
from harness.rollout_correction import apply_rollout_correction
from harness.run_status import (
    RunInterrupted,
    eval_line,
    finish_text,
    install_handlers,
    restore_handlers,
    status_line,
)
from harness.summary import eval_summary
from harness.task import Task
from harness.tracking import Tracker, run_tags
from harness.types import SamplingParams

log = logging.getLogger("rlbench")


def process_rank() -> int:
    """Global rank under torchrun (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


class Trainer:
    """One cell's training run. ``parts``: the task and algorithm already built from ``cfg`` by
    :func:`harness.config.validate_config` (the CLI's check of the cell); built here otherwise."""

    def __init__(self, cfg: DictConfig, output_dir: str | Path | None = None,
                 parts: RunParts | None = None) -> None:
        if parts is None:
            parts = validate_config(cfg)
        else:  # built by the CLI's check of this cell, from the same overrides
            resolve_defaults(cfg, parts.task)
        self.cfg = cfg
        self.task: Task = parts.task
        self.algorithm: Algorithm = parts.algorithm
        self.run_name = cfg.tracking.run_name or (
            f"{cfg.algorithm.name}-{cfg.task.name}-{cfg.model.name}-s{cfg.seed}"
        )
        self.output_dir = Path(
            cfg.trainer.output_dir or output_dir
            or Path("outputs") / f"{self.run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        self.state = LoopState()  # step, evaluations, cost ledger: saved in every checkpoint
        self.last_checkpoint: Path | None = None
        self.plan: CellPlan | None = None
        self.tracker: Tracker | None = None
        self.engine: TrainEngine
        self.rollout_engine: RolloutEngine
        self._first_step = 0  # the step this process started from (its ETA)
        self._eval_after_step = False  # a token mark wants the policy after this step's update
        self._stop_signal: int | None = None

    @property
    def step(self) -> int:
        return self.state.step

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
        ledger = self.state.ledger
        t0 = time.perf_counter()
        self.model_path = MODELS.get(cfg.model.source)(cfg.model, self.task)
        ledger.warm_start_s = time.perf_counter() - t0
        ledger.exclude(ledger.warm_start_s)  # the run's own wall time starts after it
        self.separate_engines = cfg.backend.rollout != cfg.backend.train
        self.engine, self.rollout_engine = build_engines(cfg, self.model_path,
                                                         self.algorithm.needs_reference)
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
        resumed = self._load_resume(self.plan) if self.plan.action == "resume" else None
        tags = run_tags(cfg, self.plan.config_hash, self.output_dir)
        self.tracker.start(self.run_name, tags, run_id=self.plan.run_id)
        if self.plan.claim is not None:
            self.plan.claim.note_run(self.tracker.run_id)
        if resumed is None:
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

    # -- resume state ---------------------------------------------------------------------------
    def resumables(self) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
        """The resume state, one entry per part: how it is saved and how it is restored (one
        table, so a part cannot be saved and not restored). Restored in this order after the
        engine's weights and optimizer; the RNGs last, so nothing drawn while restoring counts."""
        return {
            "loop": (self.state.state_dict, self.state.load_state_dict),
            "sampler": (self.sampler.state_dict, self.sampler.load_state_dict),
            "algorithm": (self.algorithm.state_dict, self.algorithm.load_state_dict),
            "rng": (rng_state, restore_rng_state),
        }

    def save(self) -> Path:
        state = {name: save() for name, (save, _) in self.resumables().items()}
        state["run_id"] = self.tracker.run_id if self.tracker is not None else None
        state["config"] = OmegaConf.to_container(self.cfg, resolve=True)  # for rlbench eval
        self.last_checkpoint = save_checkpoint(self.engine, self.output_dir, self.step, state)
        return self.last_checkpoint

    def _load_resume(self, plan: CellPlan) -> dict[str, Any]:
        path = plan.checkpoint
        state = upgrade_state(json.loads((path / "trainer_state.json").read_text()))
        self.engine.load(path)
        if self.separate_engines:
            self.rollout_engine.update_weights(self.engine)
        for name, (_, restore) in self.resumables().items():
            restore(state[name])
        if plan.run_id is None:
            plan.run_id = state.get("run_id")
        log.info("[%s] resuming %s: from step %d", self.run_name, plan.reason, self.step)
        return state

    # -- one step -------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One step: rollout, pi_old (and pi_ref), advantages, the update, the weight sync."""
        cfg, eng, ledger = self.cfg, self.engine, self.state.ledger
        timings: dict[str, float] = {}
        with timed(timings, "time/step"):
            ctx = RolloutContext(engine=self.rollout_engine, task=self.task,
                                 draw_prompts=self.sampler.draw,
                                 prompts_per_step=cfg.data.prompts_per_step,
                                 sampling=self.sampling, shape_rewards=self.algorithm.shape_rewards)
            batch = self.algorithm.rollout(ctx)
            if self.separate_engines:
                self.rollout_engine.sleep()  # hand the GPU memory to training
            timings.update({f"time/{k}": v for k, v in ctx.timings.items()})
            metrics: dict[str, float] = dict(ctx.metrics)
            before = ledger.tokens_total
            ledger.tokens_total += metrics.get("rollout/tokens", 0.0)
            metrics["rollout/tokens_total"] = ledger.tokens_total
            self._eval_at_marks(before, ledger.tokens_total)
            if len(batch) > 0:
                micro = cfg.trainer.micro_batch_size or cfg.trainer.mini_batch_size or len(batch)
                with timed(timings, "time/old_logprob"):
                    batch["old_logprobs"] = self.old_logprobs(batch, micro)
                metrics.update(self.rollout_correction(batch))
                if self.algorithm.needs_reference:
                    with timed(timings, "time/ref"):
                        batch["ref_logprobs"] = eng.logprobs(batch, cfg.rollout.temperature,
                                                             micro, reference=True)
                with timed(timings, "time/adv"):
                    metrics.update(self.algorithm.compute_advantages(batch))
                    batch, selected = self.algorithm.select_training_rows(batch)
                    metrics.update(selected)
                with timed(timings, "time/update"):
                    metrics.update(self.update(batch, old_is_current=True))
                with timed(timings, "time/sync"):
                    self.rollout_engine.update_weights(eng)
                if not self.separate_engines:  # one shared model: nothing was synced
                    del timings["time/sync"]
            metrics.update(rollout_metrics(batch, cfg.rollout.temperature))
            metrics["actor/lr"] = eng.lr
        return {**metrics, **timings}  # time/step, written as the block ends, comes last

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
        if self.cfg.trainer.length_bucketing and \
                not self.algorithm.policy_loss.micro_batch_coupled:
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
        if now and not self.state.evaluated(self.step):
            self._status(self.run_eval(), is_eval=True)

    def run_eval(self) -> dict[str, float]:
        metrics, samples, problems = evaluate(
            self.rollout_engine, self.task, self.cfg.seed, self.step,
            samples_to_keep=self.cfg.tracking.log_samples,
            desc=f"[{self.run_name}] eval step {self.step}", sets=self.eval_sets)
        self.state.eval_history.append({"step": self.step, **metrics})
        self.state.ledger.add_stage("eval", metrics.get("time/eval", 0.0))
        self.tracker.log_metrics(metrics, self.step)
        if samples:
            self.tracker.log_table(samples, f"samples/eval_step_{self.step:06d}.json")
        # per-problem correct counts: problem-level errors and noise can be recomputed later
        self.tracker.log_jsonl(problems, f"evals/step_{self.step:06d}.jsonl")
        return metrics

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("[%s] signal %d: stopping after this step (send again to stop at once)",
                    self.run_name, signum)

    def fit(self) -> dict[str, float]:
        """Run (or continue) training; returns the summary metrics."""
        self.state.ledger.restart_clock()
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
                if self.tracker is not None and status != "SKIPPED":
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
            self.state.step += 1
            ledger = self.state.ledger
            ledger.tokens_trained += metrics.get("actor/tokens_trained", 0.0)
            metrics["actor/tokens_trained_total"] = ledger.tokens_trained
            ledger.add_stages(metrics)
            wall = ledger.wall()
            metrics["time/wall"] = wall
            self.tracker.log_metrics(metrics, self.step)
            if cfg.status_every and self.step % cfg.status_every == 0:
                self._status(metrics)
            last = self.step == cfg.steps or (cfg.max_wall_s and wall >= cfg.max_wall_s)
            due = cfg.eval_every > 0 and (self.step % cfg.eval_every == 0 or last)
            if (due or self._eval_after_step) and not self.state.evaluated(self.step):
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
        """The cost ledger's ``final/*`` and the evaluations' (:mod:`harness.summary`)."""
        summary = self.state.ledger.summary(self.step)
        summary.update(eval_summary(self.state.eval_history))
        self.tracker.log_metrics(summary, self.step)
        return summary

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
            self.run_name, summary, self.state.ledger.warm_start_s,
            run_id=self.tracker.run_id if self.tracker.enabled else None, uri=self.tracker.uri,
            experiment=cfg.tracking.experiment, output_dir=self.output_dir,
            checkpoint=self.last_checkpoint))

    def _status(self, m: dict[str, float], is_eval: bool = False) -> None:
        if is_eval:
            log.info(eval_line(self.run_name, self.step, m))
            return
        # ETA from this process's pace (evaluations included), not from a resumed run's start
        done = self.step - self._first_step
        elapsed = self.state.ledger.elapsed()
        eta = elapsed / done * (self.cfg.trainer.steps - self.step) if done > 0 else 0.0
        log.info(status_line(self.run_name, self.step, self.cfg.trainer.steps, m, eta))


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, float]:
    return Trainer(cfg, output_dir).fit()
