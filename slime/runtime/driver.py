"""The RL driver: ``python -m slime.train RUN_DIR --task N`` runs one task's training on Ray.

What one run does, in order (THUDM/slime's loop, our code):

1. read ``tasks/<N>/resolved.json``; connect to the job's Ray cluster
   (``$RAY_ADDRESS``, set by the bootstrap) or, standalone, start a private local
   Ray (single-node specs only);
2. reserve the placement group from the same layout the preflight checked
   (``slime.placement``), start the engines (rollout backend), the trainer
   ranks (``TrainerGroup``: actor, plus a critic on the same slots for PPO) and
   the rollout manager;
3. resume from the newest complete checkpoint (or ``train.checkpoint.load`` while there is none) —
   model, optimizer, RNG, rollout id, weight version, data cursor — or start
   fresh: SFT warm-up (``algorithm.sft_warmup_steps``), weight sync, an eval of
   the starting policy;
4. per rollout: generate + reward → sequence scores → (critic values) →
   old/ref log-probs, advantages → optimizer step(s) → export weights and load
   them into every engine (``weight_version`` + 1) → evals when due → one
   ``metrics.jsonl`` line → checkpoint on interval / at the end / on a stop;
5. at the end: HF copy of the final policy, curve PNG, ``summary.json``,
   ``state.json: succeeded``.

Exit codes: 0 done · 1 bug · 2 bad input (spec, data, plug-in) · 3 infrastructure
(Ray, placement, engines) · 75 stopped by SIGUSR1/SIGTERM after saving a
checkpoint ("requeue me", see ``state.py``).

Weight sync: ``rollout.weight_sync: nccl`` broadcasts from trainer rank 0 over a
collective group (``TrainerRank.push_weights``; gloo on CPU), anything else exports
an HF checkpoint that the engines load. Colocated (``rollout.colocate``): the
engines release their memory (weights, KV cache) after each rollout and before the
SFT warm-up, and resume it around the next weight sync.

Not done here (yet): asynchronous rollouts (the loop is synchronous: generate,
then train), checkpoints during the SFT warm-up (a stop then exits 75 without one
and the warm-up reruns), over-sampling with dynamic filters.
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
from slime.runtime.state import StopFlag, TaskState

__all__ = ["Driver", "load_task_spec", "run"]

_QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
}


class Stopped(Exception):
    """A stop was requested and the state is saved (or there was nothing to save)."""


def load_task_spec(path: Path):
    import msgspec

    from slime.spec.types import Spec

    try:
        doc = json.loads(path.read_text())
        return msgspec.convert(doc["spec"], type=Spec)
    except FileNotFoundError:
        raise ValueError(
            f"{path} does not exist: pass a run dir made by slime-submit and a task index that exists in it"
        ) from None
    except (OSError, ValueError, KeyError, msgspec.ValidationError) as exc:
        raise ValueError(f"cannot read the task's resolved spec {path}: {exc}") from None


class Driver:
    def __init__(self, run_dir: Path, task: int = 0, *, json_output: bool = False) -> None:
        self.t0 = time.monotonic()
        for k, v in _QUIET_ENV.items():
            os.environ.setdefault(k, v)
        self.paths = RunPaths(Path(run_dir).resolve())
        self.task_index = task
        self.tp = self.paths.task(task)
        self.spec = load_task_spec(self.tp.resolved)
        if not self.spec.rollout.num_rollouts:
            raise ValueError(
                "rollout.num_rollouts is unknown (rollout.epochs needs a prompts file that was "
                "readable when the spec was resolved); set rollout.num_rollouts"
            )
        self.json_output = json_output
        self.stop = StopFlag()
        self.state = TaskState(self.tp.state, num_rollouts=self.spec.rollout.num_rollouts or 0)
        self.rollout_backend = None
        self.actor = self.critic = None
        self.manager = None
        self.placement = None
        self.metrics = None
        self.wandb = None
        self.progress = None
        self._own_ray = False
        self.rollout_id = -1  # last completed rollout
        self.step = 0  # optimizer steps done
        self.weight_version = 0
        self.last_export: Path | None = None
        self._engines_released = False  # colocated: engine memory handed to the trainer
        self._release_said = False
        self._sender = None
        self.checkpoint_dir: str | None = None
        self.resume_from: Path | None = None
        self.resume_state: dict[str, Any] = {}  # the state.json of resume_from, read at setup
        self._resume_from_load = False  # resume_from is train.checkpoint.load (the run has none of its own)

    # ================================================================ setup
    def say(self, message: str) -> None:
        print(f"[slime.train +{time.monotonic() - self.t0:.1f}s] {message}", file=sys.stderr, flush=True)

    def _connect(self) -> None:
        import ray

        env = dict(_QUIET_ENV.items())
        runtime_env = {"env_vars": env}
        log_to_driver = os.environ.get("SLIME_RAY_LOG_TO_DRIVER") == "1"
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=log_to_driver, logging_level="WARNING")
            return
        c = self.spec.cluster
        if c.nodes > 1:
            from slime.core.errors import InfraError

            raise InfraError(
                f"cluster.nodes={c.nodes}: a multi-node task needs the job's Ray cluster; run it with "
                "slime-submit (RAY_ADDRESS is not set)"
            )
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray runs workers at nice 15 by default; on a shared machine that starves the trainer.
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(
            num_cpus=max(2, c.cpus_per_node or os.cpu_count() or 1),
            num_gpus=c.gpus_per_node,
            resources={"slime_node_0": 1.0},
            include_dashboard=False,
            runtime_env=runtime_env,
            log_to_driver=log_to_driver,
            logging_level="WARNING",
        )
        self._own_ray = True

    def _model_dir(self) -> Path:
        m = self.spec.model
        if m.path:
            return Path(m.path)
        from slime.models.tiny import ensure_builtin_model

        return ensure_builtin_model(m.builtin or "tiny", self.tp.model_cache)

    def setup(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from slime.backends.base import ROLLOUT_BACKENDS
        from slime.placement import create_placement
        from slime.runtime.checkpoint import CheckpointStore, damaged_checkpoint
        from slime.runtime.metrics import WandbSink
        from slime.runtime.rollout_manager import RolloutManager
        from slime.runtime.trainer_group import TrainerGroup
        from slime.spec.layout import plan_layout

        spec = self.spec
        ck = spec.train.checkpoint
        self.store = CheckpointStore(ck.dir or self.tp.checkpoints, keep=ck.keep)
        self.store.check_writable()  # now, not at the first save after all the training before it
        self.resume_from = self.store.resume_point(ck.load)
        self._resume_from_load = self.resume_from is not None and self.resume_from != self.store.latest()
        if self.resume_from is not None:  # a damaged state.json fails here, before Ray and the engines start
            self.resume_state = CheckpointStore.read_state(self.resume_from, from_load=self._resume_from_load)
            missing = sorted({"rollout_id", "step", "weight_version", "manager"} - set(self.resume_state))
            if missing:
                raise damaged_checkpoint(
                    self.resume_from, f"its state.json lacks {missing}", from_load=self._resume_from_load
                )
        self.wandb = WandbSink(spec, self.tp, resume=self.resume_from is not None, task_index=self.task_index)
        shutil.rmtree(self.tp.weights, ignore_errors=True)  # exports of an earlier attempt: derived data
        self.model_dir = self._model_dir()
        self.tokenizer_dir = spec.model.tokenizer or str(self.model_dir)
        self._connect()
        self.stop.install()  # after ray.init, which installs its own SIGTERM handler
        self.say(f"connected to Ray ({'local' if self._own_ray else os.environ.get('RAY_ADDRESS')})")
        self.layout = plan_layout(spec)
        self.placement = create_placement(spec, timeout_s=min(300.0, spec.cluster.bootstrap_timeout_s))
        self.say(f"placement group ready: {len(self.layout.all_slots())} slot(s)")
        # Trainer constructors start now and load in parallel with the engines.
        self.actor = TrainerGroup(spec, self.layout, self.placement, "actor", self.layout.actor)
        if self.layout.critic:
            self.critic = TrainerGroup(spec, self.layout, self.placement, "critic", self.layout.critic)
        here = ray.get_runtime_context().get_node_id()
        self.manager = (
            ray.remote(RolloutManager)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
            .remote(spec, [], self.tokenizer_dir)
        )
        manager_ready = self.manager.setup.remote()  # reads and checks the data meanwhile
        self.rollout_backend = ROLLOUT_BACKENDS.get(spec.rollout.backend)()
        # Engines start in a thread while the trainer ranks load their models.
        engines: dict[str, Any] = {}

        def start_engines() -> None:
            try:
                engines["urls"] = self.rollout_backend.start(
                    spec, self.layout, self.placement, self.model_dir, log_dir=self.tp.logs / "engines"
                )
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                engines["error"] = exc

        thread = threading.Thread(target=start_engines, name="start-engines", daemon=True)
        thread.start()
        self.actor.init(self.model_dir)
        if self.critic is not None:
            self.critic.init(Path(spec.model.critic_path or self.model_dir))
            if self.critic.coords != self.actor.coords:
                raise RuntimeError("the critic group's data-parallel layout differs from the actor's")
        thread.join()
        if "error" in engines:
            raise engines["error"]
        urls = engines["urls"]
        self.say(f"{len(urls)} engine(s) up: {', '.join(urls)}")
        ray.get(manager_ready)  # data and reward errors surface here, typed
        ray.get(self.manager.set_engines.remote(urls))
        where = ray.get([r.where.remote() for r in self.actor.ranks])
        if self.critic is not None:
            where += ray.get([r.where.remote() for r in self.critic.ranks])
        self.say(
            f"{len(where)} trainer rank(s) up: "
            + ", ".join(f"{w['role']}{w['rank']}@{w['host']}/{w['device']}" for w in where)
        )
        self.state.update(ranks=where, engines=urls)

    # ================================================================ weights
    def sync_weights(self) -> float:
        """Export the actor's weights and load them into every engine as the next version."""
        t = time.monotonic()
        version = self.weight_version + 1
        if self._engines_released:  # SGLang's order: weights back, reload them, then the KV cache
            self.rollout_backend.resume_memory(["weights"])
        if self.spec.rollout.weight_sync == "nccl":
            if self._sender is None:
                self._sender = self.rollout_backend.weight_sender()
            self.actor.call("push_weights", version, self._sender)
        else:
            out = self.tp.weights / f"v{version}"
            if out.exists():
                shutil.rmtree(out)
            self.actor.call("export", str(out))
            self.rollout_backend.update_weights(out, version)
            if self.last_export is not None and self.last_export != out:
                shutil.rmtree(self.last_export, ignore_errors=True)
            self.last_export = out
        if self._engines_released:
            self.rollout_backend.resume_memory(["kv_cache", "cuda_graph"])
            self._engines_released = False
        self.weight_version = version
        return time.monotonic() - t

    def release_engines(self) -> None:
        """Colocated runs: the engines free their memory for the trainer until the next weight sync."""
        if self.spec.rollout.colocate and not self._engines_released:
            replies = self.rollout_backend.release_memory()
            if not self._release_said:  # once, with what was freed
                self._release_said = True
                self.say(
                    "colocated: engine memory released for training: "
                    + "; ".join(str(r.get("message", r)) for r in replies or [])
                )
            self._engines_released = True

    def _init_ref(self, fresh: bool) -> None:
        ref = self.spec.model.ref_path
        if not ref:
            return
        if ref != "initial":
            ref_dir = Path(ref)
        elif fresh and self.spec.algorithm.sft_warmup_steps > 0:
            # "initial" = the policy at the start of RL: save the warmed-up weights for this and later attempts
            tmp = self.tp.ref_model.with_name(".ref_model.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            self.actor.call("export", str(tmp))
            shutil.rmtree(self.tp.ref_model, ignore_errors=True)
            os.replace(tmp, self.tp.ref_model)
            ref_dir = self.tp.ref_model
        elif not fresh and self.tp.ref_model.is_dir():
            ref_dir = self.tp.ref_model
        else:
            ref_dir = self.model_dir
        self.actor.call("init_ref", str(ref_dir))

    # ================================================================ start
    def resume(self) -> None:
        import ray

        from slime.runtime.checkpoint import CheckpointError, damaged_checkpoint
        from slime.runtime.failures import root_cause

        ckpt = self.resume_from
        st = self.resume_state
        if st.get("world_size") not in (None, len(self.actor.ranks)):
            raise ValueError(
                f"checkpoint {ckpt} was saved by {st['world_size']} trainer ranks, this job has "
                f"{len(self.actor.ranks)}; resume with the same train.nodes/gpus_per_node"
            )
        try:
            self.actor.call("load", str(ckpt))
            if self.critic is not None:
                self.critic.call("load", str(ckpt))
        except Exception as exc:  # a truncated or missing rank file: name the dir and the usable ones
            cause = root_cause(exc)
            if isinstance(cause, (CheckpointError, FileNotFoundError)):
                raise damaged_checkpoint(ckpt, str(cause), from_load=self._resume_from_load) from None
            raise
        ray.get(self.manager.load_state_dict.remote(st["manager"]))
        self.rollout_id, self.step = int(st["rollout_id"]), int(st["step"])
        self.weight_version = int(st["weight_version"]) - 1
        self.checkpoint_dir = str(ckpt)
        self._init_ref(fresh=False)
        self.sync_weights()  # the engines get the checkpoint's weights under its version
        print(
            f"resumed from {ckpt} (rollout {self.rollout_id}, step {self.step}, weight version {self.weight_version})",
            flush=True,
        )

    def warmup(self) -> dict[str, Any]:
        """SFT warm-up, weight sync, eval of the starting policy: the ``rollout_id = -1`` line."""
        import ray

        a = self.spec.algorithm
        record: dict[str, Any] = {"rollout_id": -1, "step": 0}
        if a.sft_warmup_steps > 0:
            t = time.monotonic()
            self.release_engines()
            gbs = self.spec.train.global_batch_size or 1
            self.progress.phase("SFT warm-up", a.sft_warmup_steps)
            losses = []
            chunk = 50
            for start in range(0, a.sft_warmup_steps, chunk):
                n = min(chunk, a.sft_warmup_steps - start)
                data = ray.get(self.manager.sft_samples.remote(gbs * n))
                for i in range(n):
                    if self.stop.requested:
                        raise Stopped()
                    shards = self.actor.shards(data[i * gbs : (i + 1) * gbs], 1)
                    m = ray.get(self.actor.submit("sft_step", [(sh, start + i) for sh in shards]))[0]
                    losses.append(m["sft_loss"])
                    self.progress.update(start + i + 1, {"sft/loss": m["sft_loss"]})
            record.update(
                {
                    "sft/loss": losses[-1],
                    "sft/loss_first": losses[0],
                    "sft/steps": len(losses),
                    "time/sft_s": time.monotonic() - t,
                }
            )
            self.sync_weights()
        self._init_ref(fresh=True)
        record["weight_version"] = self.weight_version
        if self.spec.data.eval:
            t = time.monotonic()
            record.update(ray.get(self.manager.evaluate.remote(tag=-1)))
            record["time/eval_s"] = time.monotonic() - t
        return record

    # ================================================================ one rollout
    def rollout_step(self, r: int) -> dict[str, Any]:
        import ray

        from slime.runtime.rollout_metrics import mean_metrics, sample_metrics
        from slime.runtime.train_data import sequence_scores

        spec, a = self.spec, self.spec.algorithm
        steps = spec.train.num_steps_per_rollout or 1
        n = spec.rollout.n_samples_per_prompt
        t0 = time.monotonic()
        samples = ray.get(self.manager.generate.remote(r))
        self.release_engines()
        t1 = time.monotonic()
        rewards = [float(s.reward or 0.0) for s in samples]
        scores = sequence_scores(rewards, estimator=a.estimator, group_size=n, normalize_std=bool(a.normalize_std))
        data = [
            {
                "tokens": s.tokens,
                "response_length": s.response_length,
                "loss_mask": s.loss_mask,
                "rollout_log_probs": s.rollout_log_probs,
            }
            for s in samples
        ]
        shards, score_shards = self.actor.shards(data, steps), self.actor.shards(scores, steps)
        values = None
        if self.critic is not None:
            values = ray.get(self.critic.submit("values", [(sh,) for sh in shards]))
        prep = ray.get(
            self.actor.submit(
                "prepare",
                [(sh, sc, values[i] if values else None) for i, (sh, sc) in enumerate(zip(shards, score_shards))],
            )
        )
        train_refs = self.actor.submit("train", [(steps, self.step)] * len(shards))
        critic_refs = []
        if self.critic is not None:
            critic_refs = self.critic.submit(
                "train_critic",
                [(sh, p["returns"], values[i], steps, self.step) for i, (sh, p) in enumerate(zip(shards, prep))],
            )
        train_metrics = ray.get(train_refs)[0]
        critic_metrics = ray.get(critic_refs)[0] if critic_refs else []
        t2 = time.monotonic()
        used_version = self.weight_version
        sync_s = self.sync_weights()
        self.step += steps

        record: dict[str, Any] = {"rollout_id": r, "step": self.step, "weight_version": self.weight_version}
        record.update(sample_metrics(samples, rewards, n, used_version))
        if spec.agent is not None:  # tool-call rate and friends of the agent episodes
            from slime.agent.generate import rollout_metrics

            record.update(rollout_metrics(samples))
        record.update(prep[0]["metrics"])
        record["time/train_steps_s"] = sum(m.pop("step_time_s", 0.0) for m in train_metrics)
        if critic_metrics:
            record["time/critic_steps_s"] = sum(m.pop("step_time_s", 0.0) for m in critic_metrics)
        record.update(mean_metrics("train", train_metrics))
        record.update(mean_metrics("critic", critic_metrics))
        record["check/kl_before_update"] = train_metrics[0].get("approx_kl")
        if r == 0:
            record["check/step0_logprob_diff"] = record.get("train/logprob_diff")
            record["check/step0_kl"] = record["check/kl_before_update"]
            if "train/ref_kl" in record:
                record["check/step0_ref_kl"] = record["train/ref_kl"]
        t3 = time.monotonic()
        due = [e.name for e in spec.data.eval if (r + 1) % e.interval == 0 or r + 1 == spec.rollout.num_rollouts]
        if due:
            record.update(ray.get(self.manager.evaluate.remote(due, tag=r)))
        record.update(
            {
                "time/rollout_s": t1 - t0,
                "time/train_s": t2 - t1,
                "time/sync_s": sync_s,
                "time/eval_s": time.monotonic() - t3 if due else 0.0,
                "time/step_s": time.monotonic() - t0,
            }
        )
        return record

    # ================================================================ checkpoints
    def save_checkpoint(self) -> None:
        import ray

        from slime.runtime.failures import checkpoint_save_error

        tmp = None
        try:
            tmp = self.store.begin(self.rollout_id)
            self.actor.call("save", str(tmp))
            if self.critic is not None:
                self.critic.call("save", str(tmp))
            state = {
                "format": 1,
                "rollout_id": self.rollout_id,
                "step": self.step,
                "weight_version": self.weight_version,
                "world_size": len(self.actor.ranks),
                "manager": ray.get(self.manager.state_dict.remote()),
                "saved_at": time.time(),
            }
            final = self.store.commit(tmp, self.rollout_id, state)
        except BaseException as exc:
            if tmp is not None:
                self.store.abort(tmp)
            mapped = checkpoint_save_error(exc, self.store.root, self.rollout_id)  # disk full: no bug
            if mapped is not None:
                raise mapped from exc
            raise
        self.checkpoint_dir = str(final)
        self.state.update(checkpoint=self.checkpoint_dir)

    # ================================================================ the run
    def train(self) -> dict[str, Any]:
        from slime.runtime.metrics import MetricsLog
        from slime.runtime.progress import Progress

        spec = self.spec
        total = spec.rollout.num_rollouts or 0
        self.progress = Progress(total, enabled=spec.logging.progress, label="RL")
        self.setup()
        fresh = self.resume_from is None
        self.metrics = MetricsLog(self.tp.metrics, keep_through=None if fresh else int(self.resume_state["rollout_id"]))
        if fresh:
            record = self.warmup()
            self._log(record)
        else:
            self.resume()
        self.progress.phase("RL", total, completed=self.rollout_id + 1)
        interval = spec.train.checkpoint.interval
        for r in range(self.rollout_id + 1, total):
            record = self.rollout_step(r)
            self.rollout_id = r
            self._log(record)
            self.progress.update(r + 1, record)
            self.state.update(rollout_id=r, step=self.step)
            last = r + 1 == total
            if last or self.stop.requested or (interval and (r + 1) % interval == 0):
                self.save_checkpoint()
            if self.stop.requested and not last:
                raise Stopped()
        return self.finish()

    def _log(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log(record)

    def finish(self) -> dict[str, Any]:
        from slime.runtime.plots import plot_curve
        from slime.runtime.summary import final_metrics, print_summary, write_summary

        self.progress.close()
        if self.spec.train.checkpoint.save_hf:
            if self.spec.rollout.weight_sync == "nccl":  # collective sync writes no exports: write one now
                self._write_final_model(lambda tmp: self.actor.call("export", str(tmp)))
            elif self.last_export is not None:
                self._write_final_model(lambda tmp: shutil.copytree(self.last_export, tmp))
        final = final_metrics(self.metrics.rows, wall_s=time.monotonic() - self.t0)
        write_summary(self.tp.summary, final)
        plot_curve(self.metrics.rows, self.tp.plots / "curve.png", title=f"{self.spec.name} (task {self.task_index})")
        self.wandb.summary(final)
        print_summary(final, title=f"{self.spec.name}: final metrics", stderr=self.json_output)
        return final

    def _write_final_model(self, fill) -> None:
        """``final_model/`` filled by ``fill(tmp_dir)`` in a temp dir, then renamed: complete or absent."""
        tmp = self.tp.final_model.with_name(".final_model.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        fill(tmp)
        shutil.rmtree(self.tp.final_model, ignore_errors=True)
        os.replace(tmp, self.tp.final_model)

    def teardown(self, *, node_lost: bool = False) -> None:
        """Stop what this run started; after a lost node only what is local (graceful stops of actors
        that may be on the dead node wait for Ray to notice, and the job's Ray is torn down anyway)."""
        import ray

        remote = (
            ()
            if node_lost
            else (
                lambda: self.rollout_backend and self.rollout_backend.stop(),
                lambda: self.actor and self.actor.kill(),
                lambda: self.critic and self.critic.kill(),
                lambda: self.manager and ray.kill(self.manager),
                lambda: self.placement and self.placement.remove(),
            )
        )
        for closer in (
            lambda: self.progress and self.progress.close(),
            *remote,
            lambda: self.metrics and self.metrics.close(),
        ):
            try:
                closer()
            except Exception:  # noqa: BLE001 - best effort; the job is ending anyway
                pass
        if ray.is_initialized():
            ray.shutdown()


def run(run_dir: Path, task: int = 0, *, json_output: bool = False) -> int:
    from slime.runtime.failures import classify, lost_node_error, root_cause

    try:
        driver = Driver(run_dir, task, json_output=json_output)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.SPEC
    driver.state.update(state="running")
    code, final, node_lost = ExitCode.OK, None, False
    try:
        final = driver.train()
        driver.state.update(state="succeeded", exit_code=ExitCode.OK)
    except KeyboardInterrupt:
        code = 130
        print("interrupted", file=sys.stderr)
        driver.state.update(state="failed", exit_code=code, error="interrupted (SIGINT)")
    except Stopped:
        code = ExitCode.REQUEUE
        reason = driver.stop.reason or "interrupt"
        print(
            f"stopped ({reason}) after rollout {driver.rollout_id}; checkpoint: {driver.checkpoint_dir}; "
            f"exit {code} (requeue to resume)",
            file=sys.stderr,
            flush=True,
        )
        driver.state.update(state="preempted", exit_code=code, error=f"stopped by {reason}")
    except BaseException as exc:  # noqa: BLE001 - every failure ends in state.json and an exit code
        lost = lost_node_error(exc)  # a dead peer/node: exit 3 naming the node, not "a bug"
        exc, node_lost = lost or exc, lost is not None
        code = classify(exc)
        root = root_cause(exc)
        message = str(root).strip() or type(root).__name__
        if code == ExitCode.BUG:
            print("slime.train hit an internal error (a bug; please report it with this traceback):", file=sys.stderr)
            traceback.print_exc()
        else:
            print(f"error: {message}", file=sys.stderr)
        driver.state.update(state="failed", exit_code=code, error=message[:2000])
    finally:
        if driver.wandb is not None:
            driver.wandb.finish(code)
        driver.teardown(node_lost=node_lost)
    if json_output and final is not None:
        print(json.dumps({"run_dir": str(driver.paths.root), "final_metrics": final}, indent=2, sort_keys=True))
    return code
