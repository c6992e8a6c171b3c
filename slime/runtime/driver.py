"""The driver: ``python -m slime.train RUN_DIR --task N`` runs one task's training (RL or SFT) on Ray.

In order: read the task's resolved spec and pick the checkpoint to resume from (before anything
starts); start the job's Ray resources; resume, or SFT warm-up + weight sync + an eval of the
starting policy; per rollout :meth:`Driver.rollout_step` (rollout, train, weight sync, metrics line,
evals, checkpoints) or, ``kind: SFTJob``, :meth:`Driver.sft_rollout_step` (the warm-up's SFT step on the
data's transcripts); at the end the HF copy, plots and summary. Exit codes: ``slime.core.errors.ExitCode``
(75 = stopped after a checkpoint, "requeue me").
Not done: checkpoints during the SFT warm-up (a stop reruns it).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from slime.core.errors import ExitCode
from slime.core.paths import RunPaths
from slime.core.worker_env import apply_worker_env
from slime.runtime.checkpoint import CheckpointStore
from slime.runtime.job import Job, in_thread, model_dir
from slime.runtime.perf import PerfModel, perf_model, step_perf
from slime.runtime.rollout_feed import RolloutFeed, make_feed
from slime.runtime.state import StopFlag, TaskState
from slime.runtime.step_plan import critic_only
from slime.runtime.train_state import ResumePoint, TrainState, restore_checkpoint, save_checkpoint
from slime.runtime.watchdog import Watchdog, job_processes, start_board
from slime.runtime.weight_sync import WeightSync, write_dir
from slime.spec.task import load_task_spec

__all__ = ["STOP_AFTER_ENV", "Driver", "Stopped", "due_evals", "run"]


# A stop requested after this rollout, exactly as a SIGUSR1 during it would (checkpoint, exit 75):
# `slime-submit smoke` preempts a run deterministically with it to test the checkpoint and the resume.
STOP_AFTER_ENV = "SLIME_STOP_AFTER_ROLLOUT"


def _stop_after() -> int | None:
    value = os.environ.get(STOP_AFTER_ENV, "")
    return int(value) if value.strip().lstrip("-").isdigit() else None


def due_evals(spec: Any, r: int) -> list[str]:
    """The eval sets due after rollout ``r``: on their ``interval``, and all of them after the last rollout."""
    return [e.name for e in spec.data.eval if (r + 1) % e.interval == 0 or r + 1 == spec.rollout.num_rollouts]


class Stopped(Exception):
    """A stop was requested and the state is saved (or there was nothing to save)."""


class Driver:
    """One task's run: owns the job, the weight sync, the train state and the metrics sinks."""

    def __init__(self, run_dir: Path, task: int = 0, *, json_output: bool = False) -> None:
        self.t0 = time.monotonic()
        apply_worker_env(os.environ)
        self.paths = RunPaths(Path(run_dir).resolve())
        self.task_index, self.json_output = task, json_output
        self.tp = self.paths.task(task)
        self.spec = spec = load_task_spec(self.tp)
        self.sft_job = spec.kind == "SFTJob"  # rollouts are batches of the data's transcripts (sft_rollout_step)
        if spec.rollout.num_rollouts is None:
            raise ValueError(
                "rollout.num_rollouts is unknown (rollout.epochs needs a prompts file that was "
                "readable when the spec was resolved); set rollout.num_rollouts"
            )
        self.stop = StopFlag()
        self.status = TaskState(self.tp.state, num_rollouts=spec.rollout.num_rollouts)
        self.state = TrainState()
        self.job = Job(spec, self.tp, say=self.say)
        ck = spec.train.checkpoint
        self.store = CheckpointStore(ck.dir or self.tp.checkpoints, keep=ck.keep)
        self.resume_from: ResumePoint | None = None
        self.checkpoint_dir: str | None = None  # the newest checkpoint saved or resumed from
        self.model_dir = Path()  # set by setup
        self.weights: WeightSync | None = None
        self.feed: RolloutFeed | None = None
        self.perf: PerfModel | None = None
        self.metrics = self.wandb = self.tensorboard = self.progress = None
        watch_processes = lambda: job_processes(self.job)  # noqa: E731 - the job's actors when it stalls
        self.watch = Watchdog(
            spec.cluster.stall_timeout_s, self.tp, processes=watch_processes, on_stall=self.stalled, say=self.say
        )

    def say(self, message: str) -> None:
        print(f"[slime.train +{time.monotonic() - self.t0:.1f}s] {message}", file=sys.stderr, flush=True)

    # ================================================================ start
    def setup(self) -> None:
        """The checks that need no Ray first (checkpoint dir, resume point), then Ray and the job."""
        from slime.runtime.metrics import TensorBoardSink, WandbSink

        spec = self.spec
        self.store.check_writable()  # now, not at the first save after all the training before it
        self.resume_from = point = ResumePoint.find(self.store, spec.train.checkpoint.load)  # a damaged one fails here
        self.wandb = WandbSink(spec, self.tp, resume=point is not None, task_index=self.task_index)
        after = None if point is None else int(point.state["rollout_id"])
        self.tensorboard = TensorBoardSink(spec, self.tp, resume_after=after)
        shutil.rmtree(self.tp.weights, ignore_errors=True)  # exports of an earlier attempt: derived data
        ready = in_thread("prepare", lambda: model_dir(spec, self.tp))  # a built-in model build overlaps Ray's start
        self.job.connect()
        self.stop.install()  # after ray.init, which installs its own SIGTERM handler
        self.watch.start(board=start_board)  # before the workers start: their beats find it
        self.model_dir = ready.result()
        self.say(f"connected to Ray ({'local' if self.job.own_ray else os.environ.get('RAY_ADDRESS')})")
        with self.watch.phase("engine start"):
            where = self.job.start(self.model_dir, spec.model.tokenizer or str(self.model_dir))
        self.status.update(ranks=where, engines=self.job.urls)
        self.weights = WeightSync(spec, self.job.actor, self.job.engines, self.tp.weights, say=self.say)
        self.feed = make_feed(self.job.manager, spec)
        self.perf = perf_model(spec, self.model_dir, [w for w in where if w["role"] == "actor"])

    def resume(self, point: ResumePoint) -> None:
        import ray

        restore_checkpoint(point, self.state, self.job.trainers)
        ray.get(self.job.manager.load_state_dict.remote(self.state.data))
        if self.state.prefetched is not None:  # an async run's next rollout, replayed (rollout_feed)
            self.feed.restore(point.path, self.state.prefetched)
        self.checkpoint_dir = str(point.path)
        # resumed_from: evidence for `slime-submit smoke`; checkpoint: what a restart before the next save
        # resumes from (the restart record names it)
        self.status.update(resumed_from=self.checkpoint_dir, checkpoint=self.checkpoint_dir)
        self.init_ref(fresh=False)
        self.weights.sync(self.state.weight_version)  # the engines get the checkpoint's weights under its version
        st = self.state
        print(
            f"resumed from {point.path} (rollout {st.rollout_id}, step {st.step}, weight version {st.weight_version})",
            flush=True,
        )

    def warmup(self) -> dict[str, Any]:
        """SFT warm-up, weight sync, eval of the starting policy: the ``rollout_id = -1`` line. With a warm-up
        the eval sets also run before it, on the untrained policy (``sft/before/*``)."""
        import ray

        from slime.runtime.record import warmup_record

        record: dict[str, Any] = {"rollout_id": -1, "step": 0}
        if self.spec.algorithm.sft_warmup_steps > 0:
            if self.spec.data.eval:
                # The untrained policy on the same eval sets (tag -2: its own sampling seeds), so a run shows
                # what the warm-up gave and what RL added: sft/before/<name>/accuracy.
                before = ray.get(self.job.manager.evaluate.remote(tag=-2))
                record.update({f"sft/before/{k.removeprefix('eval/')}": v for k, v in before.items()})
            t = time.monotonic()
            self.weights.release()
            losses = self.sft_warmup()
            record.update(warmup_record(losses, time.monotonic() - t))
            self.sync_weights()
        self.init_ref(fresh=True)
        record["weight_version"] = self.state.weight_version
        if self.spec.data.eval:
            t = time.monotonic()
            record.update(ray.get(self.job.manager.evaluate.remote(tag=-1)))
            if self.sft_job:
                record.update(self.sft_losses([e.name for e in self.spec.data.eval]))
            record["time/eval_s"] = time.monotonic() - t
        return record

    def sft_warmup(self) -> list[float]:
        """``algorithm.sft_warmup_steps`` SFT steps on the labels; their losses."""
        import ray

        steps, gbs = self.spec.algorithm.sft_warmup_steps, self.spec.train.global_batch_size or 1
        self.progress.phase("SFT warm-up", steps)
        losses: list[float] = []
        chunk = 50  # steps' worth of samples fetched from the manager at once
        for start in range(0, steps, chunk):
            n = min(chunk, steps - start)
            data = ray.get(self.job.manager.sft_samples.remote(gbs * n))
            for i in range(n):
                if self.stop.requested:
                    raise Stopped()
                m = self.sft_update(data[i * gbs : (i + 1) * gbs], start + i)
                losses.append(m["sft_loss"])
                self.progress.update(start + i + 1, {"sft/loss": m["sft_loss"]})
        return losses

    def sft_update(self, part: list[dict], step: int) -> dict[str, float]:
        """One optimizer step of the SFT loss on ``part``: the warm-up's, and each of an SFT job's steps."""
        actor = self.job.actor
        one_step = actor.plan([len(x["tokens"]) for x in part], len(part))
        return actor.sft_step(actor.shards(part, one_step), step)

    def sft_losses(self, names: list[str]) -> dict[str, float]:
        """``kind: SFTJob``: ``eval/<name>/loss``, the held-out NLL per trained token of the named eval sets
        (the first set's also as ``eval/loss``)."""
        import ray

        out: dict[str, float] = {}
        actor, first = self.job.actor, self.spec.data.eval[0].name if self.spec.data.eval else None
        for name in names:
            samples = ray.get(self.job.manager.sft_eval_samples.remote(name))
            plan = actor.plan([len(x["tokens"]) for x in samples], len(samples))
            out[f"eval/{name}/loss"] = actor.sft_eval(actor.shards(samples, plan))["loss"]
            if name == first:
                out["eval/loss"] = out[f"eval/{name}/loss"]
        return out

    def init_ref(self, *, fresh: bool) -> None:
        """Load the frozen reference model (``model.ref_path``) and the OPD teacher into the actor ranks."""
        opd = self.spec.algorithm.opd
        # on-policy distillation's teacher, beside the reference (type engine: served by the teacher engine)
        if opd is not None and opd.type == "trainer" and self.job.actor is not None:
            self.job.actor.call("init_teacher", opd.teacher)
        ref = self.spec.model.ref_path
        if not ref or self.job.actor is None:
            return
        if ref != "initial":
            ref_dir = Path(ref)
        elif fresh and self.spec.algorithm.sft_warmup_steps > 0:
            # "initial" = the policy at the start of RL: save the warmed-up weights for this and later attempts
            write_dir(self.tp.ref_model, self.job.actor.export)
            ref_dir = self.tp.ref_model
        elif not fresh and self.tp.ref_model.is_dir():
            ref_dir = self.tp.ref_model
        else:
            ref_dir = self.model_dir
        self.job.actor.call("init_ref", str(ref_dir))

    # ================================================================ one rollout
    def rollout_step(self, r: int) -> dict[str, Any]:
        """Rollout ``r``: take → (async: prefetch r+1) → train → (settle) → sync → record → eval.

        Tensors stay on the ranks: values and returns pass between critic and actor ranks as Ray
        refs; the driver fetches only samples and metrics."""

        from slime.runtime.record import rollout_record

        st = self.state
        t0 = time.monotonic()
        with self.watch.phase("rollout", rollout=r, step=st.step):
            taken = self.feed.take(r, st.weight_version)  # prompts → … → filters (or generated ahead)
            self.feed.prefetch(r + 1, st.weight_version)  # async: r+1 generates with these weights while r trains
            self.weights.release()  # colocated: the engines' memory goes to the trainer
        t1 = time.monotonic()
        sidecars = (self.tp.rollouts, r) if self.spec.debug.save_rollouts else None  # the trainer's log-probs
        actor = not critic_only(self.spec.algorithm, r)  # critic-only warm-up: the actor's weights and optimizer wait
        with self.watch.phase("train step", rollout=r, step=st.step):
            steps, prep_m, train_m, critic_m = self.train_on(taken.samples, sidecars, actor=actor)
        t2 = time.monotonic()
        with self.watch.phase("rollout", rollout=r, step=st.step):
            self.feed.settle()  # async: rollout r+1 is complete before the weights change
        policy_version = st.weight_version  # the weights the trainer started this step from
        with self.watch.phase("weight sync", rollout=r, step=st.step):
            sync_s = self.sync_weights() if steps and actor else 0.0  # no actor step, no new weights
        st.step += steps
        record = rollout_record(
            r,
            step=st.step,
            weight_version=st.weight_version,
            samples=taken.samples,
            used_version=taken.version,
            policy_version=policy_version,
            prepare=prep_m,
            train=train_m,
            critic=critic_m,
            agent=self.spec.agent is not None,
        )
        if steps and (c := self.spec.algorithm.critic) is not None and c.warmup_rollouts:  # only where it can be 1
            record["train/critic_only"] = float(not actor)
        if self.spec.train.async_mode == "fully":  # samples of several versions: the bound is what must hold
            k = self.spec.train.async_.max_staleness
            record["check/stale_samples"] = sum(policy_version - s.weight_version > k for s in taken.samples)
        record.update(taken.metrics)  # rollout/groups_*: what the generation drew, kept and dropped
        record.update(self.evaluate(r))
        times = {
            "time/rollout_s": (t1 - t0) + self.feed.settle_wait_s,  # the loop's wait for rollouts this step
            "time/generate_s": taken.generate_s,
            "time/train_s": t2 - t1,
            "time/sync_s": sync_s,
            "time/eval_s": record["time/eval_s"],
            "time/step_s": time.monotonic() - t0,
        }
        record.update(times)
        record.update(step_perf(self.perf, taken.samples, times))
        return record

    def sft_rollout_step(self, r: int) -> dict[str, Any]:
        """``kind: SFTJob``'s rollout ``r``: the next ``rollout.batch_size`` transcripts → optimizer steps of
        ``train.global_batch_size`` on the SFT loss → record → when evals are due (and after the last rollout)
        weight sync, held-out generations and held-out loss. No engine work between evals."""
        import ray

        from slime.runtime.record import mean_metrics

        st, spec = self.state, self.spec
        t0 = time.monotonic()
        samples = ray.get(self.job.manager.sft_batch.remote())
        self.weights.release()  # colocated: the engines' memory goes to the trainer until the next eval
        gbs = spec.train.global_batch_size or len(samples)
        t1 = time.monotonic()
        train = []
        for i in range(0, len(samples), gbs):
            train.append(self.sft_update(samples[i : i + gbs], st.step))
            st.step += 1
        t2 = time.monotonic()
        due = due_evals(spec, r)
        sync_s = self.sync_weights() if due or r + 1 == spec.rollout.num_rollouts else 0.0
        record: dict[str, Any] = {"rollout_id": r, "step": st.step, "weight_version": st.weight_version}
        record["train/tokens"] = sum(sum(x.get("loss_mask") or [1] * x["response_length"]) for x in samples)
        record.update(mean_metrics("train", train))
        record.update(self.evaluate(r))
        if due:
            t3 = time.monotonic()
            record.update(self.sft_losses(due))
            record["time/eval_s"] += time.monotonic() - t3
        record.update(
            {
                "time/rollout_s": t1 - t0,
                "time/train_s": t2 - t1,
                "time/sync_s": sync_s,
                "time/step_s": time.monotonic() - t0,
            }
        )
        return record

    def train_on(
        self, samples: list, sidecars: tuple[Path, int] | None = None, *, actor: bool = True
    ) -> tuple[int, dict[str, float], list[dict], list[dict]]:
        """Scores → step plan → (critic values) → prepare (old/ref log-probs, advantages) → optimizer steps.

        ``sidecars``: ``(rollouts dir, rollout id)`` where the ranks save their old log-probs. Returns ``(steps,
        prepare metrics, actor metrics per step, critic metrics per step)``; no step without trainer ranks or
        with fewer samples than data-parallel ranks. ``actor=False``: only the critic takes its steps."""
        import ray

        from slime.rl.sample import episode_id
        from slime.runtime.step_plan import ShardScores, train_inputs

        job, t = self.job, self.spec.train
        if job.actor is None or len(samples) < job.actor.dp_size:
            if job.actor is not None:
                self.say(f"no optimizer step: {len(samples)} sample(s) for {job.actor.dp_size} data-parallel ranks")
            return 0, {}, [], []
        inputs = train_inputs(samples)
        plan = job.actor.plan(
            [len(x["tokens"]) for x in inputs],
            t.global_batch_size or len(inputs),
            balance_tokens=t.dynamic_batch.enabled,
        )
        rollout = {
            "rewards": tuple(float(s.reward or 0.0) for s in samples),
            "group_ids": tuple(s.group_index for s in samples),
            "episode_ids": tuple(episode_id(s) for s in samples),
        }
        # the ranks compute the sequence scores (train_data.rank_scores): group statistics over the whole rollout
        scores = [ShardScores(**rollout, indices=tuple(ix)) for ix in job.actor.shards(range(len(inputs)), plan)]
        shards = job.actor.shards(inputs, plan)
        values = job.critic.values(shards) if job.critic is not None else None  # refs → the actor ranks (GAE)
        prep, returns = job.actor.prepare(shards, scores, values, sidecars)  # old/ref log-probs, advantages
        train = job.actor.train(plan, self.state.step) if actor else None
        critic = job.critic.train_critic(returns, plan, self.state.step) if job.critic is not None else []
        critic_m = ray.get(critic)[0] if critic else []
        return plan.steps, ray.get(prep)[0], ray.get(train)[0] if actor else [], critic_m

    def sync_weights(self) -> float:
        """The engines serve the actor's weights as the next version; returns the seconds taken."""
        seconds = self.weights.sync(self.state.weight_version + 1, hold=self.feed.hold)
        self.state.weight_version += 1
        return seconds

    def evaluate(self, r: int) -> dict[str, Any]:
        """``eval/*`` of the sets due after rollout ``r`` (their interval, or the last rollout)."""
        import ray

        due = due_evals(self.spec, r)
        if not due:
            return {"time/eval_s": 0.0}
        t = time.monotonic()
        with self.watch.phase("eval", rollout=r):
            out = ray.get(self.job.manager.evaluate.remote(due, tag=r))
        out["time/eval_s"] = time.monotonic() - t
        return out

    # ================================================================ the run
    def train(self) -> dict[str, Any]:
        from slime.runtime.metrics import MetricsLog
        from slime.runtime.progress import Progress

        spec, st = self.spec, self.state
        total = spec.rollout.num_rollouts or 0
        self.progress = Progress(total, enabled=spec.logging.progress, label="SFT" if self.sft_job else "RL")
        self.setup()
        point = self.resume_from
        self.metrics = MetricsLog(
            self.tp.metrics, keep_through=None if point is None else int(point.state["rollout_id"])
        )
        if point is None:
            self.log(self.warmup())
        else:
            self.resume(point)
        self.progress.phase("SFT" if self.sft_job else "RL", total, completed=st.rollout_id + 1)
        if st.rollout_id + 1 < total:
            self.feed.start()  # fully-async: the stream generates from here on (else nothing)
        interval = spec.train.checkpoint.interval
        stop_after = _stop_after()
        for r in range(st.rollout_id + 1, total):
            record = self.sft_rollout_step(r) if self.sft_job else self.rollout_step(r)
            st.rollout_id = r
            self.log(record)
            self.progress.update(r + 1, record)
            self.status.update(rollout_id=r, step=st.step)
            if r == stop_after:  # as if SIGUSR1 had come during rollout r
                self.stop.request(STOP_AFTER_ENV)
            last = r + 1 == total
            if last or self.stop.requested or (interval and (r + 1) % interval == 0):
                self.checkpoint()
            if self.stop.requested and not last:
                raise Stopped()
        return self.finish()

    def log(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log(record)
        self.tensorboard.log(record)

    def checkpoint(self) -> None:
        import ray

        with self.watch.phase("rollout", rollout=self.state.rollout_id):
            self.feed.settle()
        with self.watch.phase("checkpoint save", rollout=self.state.rollout_id, step=self.state.step), self.feed.hold():
            self.state.data = ray.get(self.job.manager.state_dict.remote())
            self.state.prefetched = self.feed.pending_id
            files = self.feed.checkpoint_files()
            self.checkpoint_dir = str(save_checkpoint(self.store, self.state, self.job.trainers, files))
        self.status.update(checkpoint=self.checkpoint_dir)

    def finish(self) -> dict[str, Any]:
        from slime.runtime.plots import plot_curve
        from slime.runtime.summary import final_metrics, print_summary, write_summary

        self.progress.close()
        if self.spec.train.checkpoint.save_hf and self.job.actor is None:  # rollout_only: the model as it was
            write_dir(self.tp.final_model, lambda tmp: shutil.copytree(self.model_dir, tmp))
        elif self.spec.train.checkpoint.save_hf:
            self.weights.write_final_model(self.tp.final_model)
        final = final_metrics(self.metrics.rows, wall_s=time.monotonic() - self.t0)
        write_summary(self.tp.summary, final)
        plot_curve(self.metrics.rows, self.tp.plots / "curve.png", title=f"{self.spec.name} (task {self.task_index})")
        self.wandb.summary(final)
        print_summary(final, title=f"{self.spec.name}: final metrics", stderr=self.json_output)
        return final

    def stalled(self, d: Any) -> None:
        """The watchdog's end of a stalled run (from its thread; the process exits 124 after it)."""
        print(f"error: {d.title}; stacks in {d.stacks}. Fix: {d.fix}", file=sys.stderr, flush=True)
        self.status.update(state="failed", exit_code=ExitCode.STALL, error=d.title)
        if self.wandb is not None:
            self.wandb.finish(ExitCode.STALL)
        self.teardown()

    def teardown(self, *, node_lost: bool = False) -> None:
        """Stop what this run started (``Job.teardown``) and close the local sinks."""
        for closer in (lambda: self.progress and self.progress.close(), lambda: self.metrics and self.metrics.close()):
            try:
                closer()
            except Exception:  # noqa: BLE001 - best effort; the job is ending anyway
                pass
        self.job.teardown(node_lost=node_lost)
        self.watch.close()


def _failure(driver: Driver, exc: BaseException) -> tuple[int, bool]:
    """Report a failed run (state.json, stderr); returns its exit code and whether a node was lost."""
    from slime.runtime.failures import classify, lost_node_error, root_cause

    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        driver.status.update(state="failed", exit_code=130, error="interrupted (SIGINT)")
        return 130, False
    if isinstance(exc, Stopped):
        code, reason = ExitCode.REQUEUE, driver.stop.reason or "interrupt"
        print(
            f"stopped ({reason}) after rollout {driver.state.rollout_id}; checkpoint: {driver.checkpoint_dir}; "
            f"exit {code} (requeue to resume)",
            file=sys.stderr,
            flush=True,
        )
        driver.status.update(state="preempted", exit_code=code, error=f"stopped by {reason}")
        return code, False
    if driver.watch.firing.is_set():  # a stall: the watchdog's thread ends the run (Driver.stalled)
        threading.Event().wait()
    lost = lost_node_error(exc)  # a dead peer/node: exit 3 naming the node, not "a bug"
    if lost is not None:
        lost.__cause__ = exc  # the diagnosis reads the original error too
    exc = lost or exc
    code = classify(exc)
    root = root_cause(exc)
    message = str(root).strip() or type(root).__name__
    if code == ExitCode.BUG:
        print("slime.train hit an internal error (a bug; please report it with this traceback):", file=sys.stderr)
        traceback.print_exc()
    else:
        print(f"error: {message}", file=sys.stderr)
    code = _record_diagnosis(driver, exc, code)
    driver.status.update(state="failed", exit_code=code, error=message[:2000])
    return code, lost is not None


def _record_diagnosis(driver: Driver, exc: BaseException, code: int) -> int:
    """Append the failure's ``diagnosis.json`` record; returns the exit code its cause decides (a collective
    timeout is a stall: 124)."""
    from slime.diagnosis.record import append
    from slime.runtime.failures import diagnose

    phase, rollout, step = driver.watch.failed_in or (None, None, driver.state.step)
    try:
        since = time.time() - (time.monotonic() - driver.t0)
        d = diagnose(exc, code, phase=phase, rollout=rollout, step=step, since=since, spec=driver.spec)
        record = append(driver.tp, d)
    except Exception as err:  # noqa: BLE001 - the failure itself is what the user needs to see
        print(f"(could not write the diagnosis record: {err})", file=sys.stderr)
        return code
    print(f"diagnosis: {record.title}. Fix: {record.fix} (slime-submit why)", file=sys.stderr, flush=True)
    return record.exit_code


def run(run_dir: Path, task: int = 0, *, json_output: bool = False) -> int:
    try:
        driver = Driver(run_dir, task, json_output=json_output)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.SPEC
    driver.status.update(state="running")
    code, final, node_lost = ExitCode.OK, None, False
    try:
        final = driver.train()
        driver.status.update(state="succeeded", exit_code=ExitCode.OK)
    except BaseException as exc:  # noqa: BLE001 - every failure ends in state.json and an exit code
        code, node_lost = _failure(driver, exc)
    finally:
        if driver.wandb is not None:
            driver.wandb.finish(code)
        if driver.tensorboard is not None:
            driver.tensorboard.close()
        driver.teardown(node_lost=node_lost)
    if json_output and final is not None:
        print(json.dumps({"run_dir": str(driver.paths.root), "final_metrics": final}, indent=2, sort_keys=True))
    return code
