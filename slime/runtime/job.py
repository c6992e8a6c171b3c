"""What one run starts on Ray, and stops again: the resources the driver owns.

:class:`Job` holds each resource (``None`` until started), so :meth:`Job.teardown` stops exactly
what a run got to: :meth:`~Job.connect` (the job's Ray, or a private local one standalone),
:meth:`~Job.start` (placement group, trainer ranks, rollout manager, engines, an OPD teacher engine;
engines load while the ranks and the manager do) and teardown in reverse. Guaranteed: the manager's
data and reward errors surface from ``start`` typed; a critic whose data-parallel layout differs from
the actor's is refused; a GPU slot without CUDA fails the start; the first engine must refuse a
request without the job's secret. Not guaranteed: after a lost node, only local things are stopped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.core.worker_env import apply_worker_env
from slime.spec.resolve import starts_engines

if TYPE_CHECKING:
    from slime.backends.base import RolloutBackend
    from slime.core.paths import TaskPaths
    from slime.placement import Placement
    from slime.runtime.trainer_group import TrainerGroup
    from slime.spec.layout import Layout
    from slime.spec.types import Spec

__all__ = ["Job", "in_thread", "model_dir"]


def model_dir(spec: Spec, tp: TaskPaths) -> Path:
    """The policy's HF dir: ``model.path``, else the built-in model (built once into the task's cache)."""
    if spec.model.path:
        return Path(spec.model.path)
    from slime.models.tiny import ensure_builtin_model

    return ensure_builtin_model(spec.model.builtin or "tiny", tp.model_cache)


def in_thread(name: str, fn: Callable[[], Any]) -> Future:
    """``fn()`` in a daemon thread (abandoned if the caller fails first); ``.result()`` re-raises."""
    fut: Future = Future()

    def target() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised by .result() in the caller
            fut.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


class Job:
    def __init__(self, spec: Spec, tp: TaskPaths, *, say: Callable[[str], None]) -> None:
        self.spec, self.tp, self.say = spec, tp, say
        self.own_ray = False  # this process started Ray (standalone run)
        self.layout: Layout | None = None
        self.placement: Placement | None = None
        self.actor: TrainerGroup | None = None
        self.critic: TrainerGroup | None = None
        self.manager: Any = None  # the RolloutManager Ray actor
        self.engines: RolloutBackend | None = None
        self.urls: list[str] = []  # the engines' base URLs
        self.teacher: RolloutBackend | None = None  # algorithm.opd type engine: the teacher engine (layout.teacher)

    @property
    def trainers(self) -> list[TrainerGroup]:
        """The groups whose ranks hold trained state (checkpointed): actor first, then the critic."""
        return [g for g in (self.actor, self.critic) if g is not None]

    def connect(self) -> None:
        import ray

        # Workers inherit slime.core.worker_env's variables from the raylet (the bootstrap's ``ray start``, or
        # this process's environment, where the Driver put them first): no runtime_env, which would add a
        # setup process per worker.
        log_to_driver = os.environ.get("SLIME_RAY_LOG_TO_DRIVER") == "1"
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=log_to_driver, logging_level="WARNING")
            return
        c = self.spec.cluster
        if c.nodes > 1:
            from slime.core.errors import InfraError

            raise InfraError(
                f"cluster.nodes={c.nodes}: a multi-node task needs the job's Ray cluster; run it with "
                "slime-submit (RAY_ADDRESS is not set)"
            )
        apply_worker_env(os.environ)  # what the bootstrap gives a launched job; Ray's workers inherit it
        ray.init(
            num_cpus=max(2, c.cpus_per_node or os.cpu_count() or 1),
            num_gpus=c.gpus_per_node,
            resources={"slime_node_0": 1.0},
            include_dashboard=False,
            log_to_driver=log_to_driver,
            logging_level="WARNING",
        )
        self.own_ray = True

    def start(self, model: Path, tokenizer_dir: str) -> list[dict[str, Any]]:
        """Start everything (see the module doc); returns where each trainer rank runs."""
        import ray

        from slime.backends.base import ROLLOUT_BACKENDS
        from slime.placement import create_placement
        from slime.runtime.trainer_group import TrainerGroup
        from slime.spec.layout import plan_layout

        spec = self.spec
        self.layout = layout = plan_layout(spec)
        self.placement = create_placement(spec, timeout_s=min(300.0, spec.cluster.bootstrap_timeout_s))
        self.say(f"placement group ready: {len(layout.all_slots())} slot(s)")
        if spec.cluster.fake_gpus:
            self.say(
                f"fake GPUs: running on CPU (cluster.fake_gpus: the {len(layout.all_slots())} GPU slot(s) are "
                "placeholders; trainer ranks and engines use no CUDA)"
            )
        mode = spec.debug.mode  # rollout_only: no trainer ranks; train_only: no engines
        if mode != "rollout_only":  # trainer constructors start now and load in parallel with the engines
            self.actor = TrainerGroup(spec, layout, self.placement, "actor", layout.actor)
            if layout.critic:
                self.critic = TrainerGroup(spec, layout, self.placement, "critic", layout.critic)
        self.manager = self._start_manager(tokenizer_dir)
        manager_ready = self.manager.setup.remote()  # reads and checks the data meanwhile
        started = None
        if starts_engines(spec):
            if spec.rollout.external:  # engines the job did not start: it only talks to them
                from slime.backends.rollout.external import ExternalEngines

                self.engines = engines = ExternalEngines(spec)
            else:
                self.engines = engines = ROLLOUT_BACKENDS.get(spec.rollout.backend)()
            started = in_thread(
                "start-engines",
                lambda: engines.start(spec, layout, self.placement, model, log_dir=self.tp.logs / "engines"),
            )
        teacher = self._start_teacher(layout)
        self._init_trainers(model)
        self.urls = started.result() if started is not None else []
        self.say(
            f"{len(self.urls)} engine(s) up: {', '.join(self.urls)}"
            if started
            else "no engines (train_only, or an SFTJob without eval sets)"
        )
        if not spec.rollout.external:  # external engines hold their own token (the preflight checked them)
            check_engine_auth(self.urls)
        ray.get(manager_ready)  # data and reward errors surface here, typed
        prefill = self.engines.prefill_engines() if self.engines is not None else {}
        ray.get(self.manager.set_engines.remote(self.urls, prefill))
        if teacher is not None:
            url = teacher.result()
            self.say(f"teacher engine up: {url} ({self.spec.algorithm.opd.teacher})")
            ray.get(self.manager.set_teacher.remote(url))
        where = ray.get([r.where.remote() for g in self.trainers for r in g.ranks])
        self.say(
            f"{len(where)} trainer rank(s) up: "
            + ", ".join(f"{w['role']}{w['rank']}@{w['host']}/{w['device']}" for w in where)
        )
        return where

    def _start_teacher(self, layout: Layout) -> Future | None:
        """``algorithm.opd.type: engine``: the teacher's engine on ``layout.teacher``, starting in a thread."""
        from slime.backends.base import ROLLOUT_BACKENDS

        if not layout.teacher:
            return None
        spec = self.spec
        self.teacher = teacher = ROLLOUT_BACKENDS.get(spec.rollout.backend)()
        path = Path(spec.algorithm.opd.teacher)
        return in_thread("start-teacher", lambda: teacher.start_teacher(spec, layout, self.placement, path))

    def _init_trainers(self, model: Path) -> None:
        if self.actor is None:
            return
        self.actor.init(model)
        if self.critic is not None:
            self.critic.init(Path(self.spec.model.critic_path or model))
            if self.critic.coords != self.actor.coords:  # their ranks exchange values and returns pairwise
                raise RuntimeError("the critic group's data-parallel layout differs from the actor's")

    def _start_manager(self, tokenizer_dir: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from slime.runtime.rollout_manager import RolloutManager

        here = ray.get_runtime_context().get_node_id()
        saved = str(self.tp.rollouts) if self.spec.debug.save_rollouts else None
        return (
            ray.remote(RolloutManager)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
            .remote(self.spec, [], tokenizer_dir, rollouts_dir=saved)
        )

    def teardown(self, *, node_lost: bool = False) -> None:
        """Stop what was started (best effort: the run is ending anyway), then Ray."""
        import ray

        if not node_lost:
            for closer in (
                lambda: self.engines and self.engines.stop(),
                lambda: self.teacher and self.teacher.stop(),
                lambda: self.actor and self.actor.kill(),
                lambda: self.critic and self.critic.kill(),
                lambda: self.manager and ray.kill(self.manager),
                lambda: self.placement and self.placement.remove(),
            ):
                try:
                    closer()
                except Exception:  # noqa: BLE001 - best effort; the job is ending anyway
                    pass
        if ray.is_initialized():
            ray.shutdown()


def check_engine_auth(urls: list[str]) -> None:
    """The first engine must refuse a request without the job's secret (401/403), else exit 3 naming it."""
    from slime.core.auth import http_refused, job_secret

    if not urls or job_secret() is None:
        return
    problem = http_refused(urls[0])
    if problem is not None:
        from slime.core.errors import InfraError

        raise InfraError(
            f"engine 0 is open to anyone on the network: {problem}. Fix: the engine must get the job's "
            "secret (slime.core.auth; SGLang: --config with api-key), or set SLIME_JOB_AUTH=off knowingly"
        )
