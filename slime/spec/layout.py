"""The one function that turns a resolved spec into roles and device slots.

The validator, the preflight and the runtime all use :func:`plan_layout`, so they cannot disagree.
GPU clusters: colocated engines share the actor's slots, disaggregated ones follow them; CPU-only
clusters have one slot per node (two with ``train.async``). The PPO critic reuses the actor's slots.
Engines may have roles (the rollout plug-in's ``engine_roles`` hook: SGLang's prefill/decode groups);
an OPD teacher engine shares engine 0's slots.
Guaranteed: pure and deterministic (no I/O; the spec types and plug-in hooks only); the layouts of
the last few (frozen) specs are cached, so one process computes each once.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.spec.resolve import starts_engines
from slime.spec.types import Spec

__all__ = ["Layout", "LayoutError", "Slot", "layout_counts", "layout_table", "plan_layout"]


class LayoutError(ValueError):
    """The requested roles do not fit the cluster; the message lists every number involved."""

    def __init__(self, message: str, *, path: str, hint: str) -> None:
        super().__init__(message)
        self.path = path
        self.hint = hint


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot:
    """One device slot: a GPU on a node, or the node's CPU when gpu is None."""

    node: int
    gpu: int | None
    part: int = 0  # CPU slots of one node (a split CPU layout): 0 the trainer's, 1 the engines'

    def __str__(self) -> str:
        if self.gpu is not None:
            return f"node{self.node}:gpu{self.gpu}"
        return f"node{self.node}:cpu{self.part or ''}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Who runs where. Engine i uses ``engines[i]`` (its GPUs, in TP-rank order)."""

    nodes: int
    gpus_per_node: int
    colocate: bool
    actor: tuple[Slot, ...]
    critic: tuple[Slot, ...]
    engines: tuple[tuple[Slot, ...], ...]
    total_slots: int  # len(all_slots())
    rollout_offset: int
    cpu_split: bool = False  # CPU-only: trainer and engines on separate slots (parts) of each node
    engine_roles: tuple[str, ...] = ()  # engine i's role (e.g. 'prefill', 'decode'); () = all regular
    teacher: tuple[Slot, ...] = ()  # algorithm.opd type engine: the teacher engine's slots (engine 0's)

    def engine_name(self, i: int) -> str:
        """``engine3``, or ``engine3:decode`` where engines have roles (placement rows, preflight, render)."""
        return f"engine{i}" + (f":{self.engine_roles[i]}" if self.engine_roles else "")

    @property
    def cpu_only(self) -> bool:
        return self.gpus_per_node == 0

    def all_slots(self) -> tuple[Slot, ...]:
        """The slots some role uses, by node then GPU (then part): one placement bundle each."""
        if self.cpu_only and not self.cpu_split:
            return tuple(Slot(node=n, gpu=None) for n in range(self.nodes))
        # The roles' own slots, not a flat prefix of node0:gpu0..: an actor on gpu0-3 of two
        # 8-GPU nodes needs bundles on both nodes.
        used = {*self.actor, *self.critic, *(s for e in self.engines for s in e)}
        return tuple(sorted(used, key=lambda s: (s.node, -1 if s.gpu is None else s.gpu, s.part)))

    def roles_of(self, slot: Slot) -> list[str]:
        roles = []
        if slot in self.actor:
            roles.append("actor")
        if slot in self.critic:
            roles.append("critic")
        for i, engine in enumerate(self.engines):
            if slot in engine:
                roles.append(self.engine_name(i))
        if slot in self.teacher:
            roles.append("teacher")
        return roles


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutCounts:
    actor_gpus: int
    rollout_gpus: int
    total: int
    offset: int
    available: int


def layout_counts(spec: Spec) -> LayoutCounts:
    c, t, r = spec.cluster, spec.train, spec.rollout
    actor = t.nodes * (t.gpus_per_node or 0)
    rollout = (r.gpus or 0) if starts_engines(spec) else 0
    if r.colocate:
        total, offset = max(actor, rollout), 0
    else:
        total, offset = actor + rollout, actor
    return LayoutCounts(
        actor_gpus=actor, rollout_gpus=rollout, total=total, offset=offset, available=c.nodes * c.gpus_per_node
    )


def _cpu_layout(spec: Spec) -> Layout:
    nodes = spec.cluster.nodes
    if spec.train.nodes > nodes:
        raise LayoutError(
            f"train.nodes={spec.train.nodes} exceeds cluster.nodes={nodes}",
            path="train.nodes",
            hint=f"set train.nodes <= {nodes} or raise cluster.nodes",
        )
    actor = tuple(Slot(node=n, gpu=None) for n in range(spec.train.nodes))
    n_engines = 0 if spec.rollout.external else spec.rollout.num_engines or 1  # external engines take no slots
    split = spec.train.async_ and not spec.rollout.colocate
    engines = tuple((Slot(node=i % nodes, gpu=None, part=int(split)),) for i in range(n_engines))
    critic = actor if spec.algorithm.estimator == "ppo" else ()
    return Layout(
        nodes=nodes,
        gpus_per_node=0,
        colocate=spec.rollout.colocate,
        actor=actor,
        critic=critic,
        engines=engines,
        total_slots=len({*actor, *(e[0] for e in engines)}) if split else nodes,
        rollout_offset=0,
        cpu_split=split,
        teacher=_teacher_slots(spec, engines),
    )


_RECENT: dict[int, tuple[Spec, Layout]] = {}  # id(spec) -> (that spec, kept so its id stays its own; layout)
_RECENT_SIZE = 64


def plan_layout(spec: Spec) -> Layout:
    """Place actor, critic and engines on slots, or raise LayoutError naming the numbers.

    The same spec object gets the same Layout object (see the module doc); errors are not kept."""
    hit = _RECENT.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    layout = _plan(spec)
    if len(_RECENT) >= _RECENT_SIZE:
        _RECENT.pop(next(iter(_RECENT)))
    _RECENT[id(spec)] = (spec, layout)
    return layout


def _plan(spec: Spec) -> Layout:
    c, t, r = spec.cluster, spec.train, spec.rollout
    if c.gpus_per_node == 0:
        return _cpu_layout(spec)
    n = _check_counts(spec)
    # Actor: train.gpus_per_node GPUs on each of the first train.nodes nodes.
    actor = tuple(Slot(node=nd, gpu=g) for nd in range(t.nodes) for g in range(t.gpus_per_node or 0))
    pool, gpe = _engine_pool(spec, actor, n), r.gpus_per_engine
    engines = [
        _engine_slots(i, tuple(pool[i * gpe : (i + 1) * gpe]), gpe, c.gpus_per_node)
        for i in range(0 if r.external else n.rollout_gpus // gpe)  # external engines take no slots
    ]
    critic = actor if spec.algorithm.estimator == "ppo" else ()
    used = {*actor, *(s for e in engines for s in e)}
    return Layout(
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        colocate=r.colocate,
        actor=actor,
        critic=critic,
        engines=tuple(engines),
        total_slots=len(used),
        rollout_offset=n.offset,
        engine_roles=_engine_roles(spec, len(engines)),
        teacher=_teacher_slots(spec, engines),
    )


def _teacher_slots(spec: Spec, engines) -> tuple[Slot, ...]:
    """On-policy distillation from a teacher engine: it shares engine 0's slots (it scores while they idle)."""
    opd = spec.algorithm.opd
    return tuple(engines[0]) if opd is not None and opd.type == "engine" and engines else ()


def _engine_roles(spec: Spec, n: int) -> tuple[str, ...]:
    """The rollout plug-in's engine roles (its ``engine_roles`` hook), one per engine, or ()."""
    from slime.spec.plugin import hook, selected

    roles = tuple(hook(selected(spec, "rollout_backend"), "engine_roles", lambda _: ())(spec))
    if roles and len(roles) != n:  # the plug-in counted engines differently: a bug, not a spec error
        raise AssertionError(f"{len(roles)} engine roles for {n} engines")
    return roles


def _span(slots) -> str:
    """``node0:gpu4-7`` / ``node0:gpu6-7, node1:gpu0-1``: a run of slots, node by node."""
    out = []
    for nd in sorted({s.node for s in slots}):
        gpus = sorted(s.gpu for s in slots if s.node == nd and s.gpu is not None)
        if not gpus:
            out.append(f"node{nd}:cpu")
            continue
        runs, start = [], gpus[0]
        for a, b in zip(gpus, gpus[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        out.append(f"node{nd}:gpu{','.join(runs)}")
    return ", ".join(out)


def layout_table(layout: Layout) -> list[str]:
    """One line per role group (actor, critic, each engine role): engines, GPUs and where (render, docs)."""
    rows = [("role", "engines", "GPUs", "slots")]
    if layout.actor:
        rows.append(("actor", "-", str(len(layout.actor)), _span(layout.actor)))
    if layout.critic:
        rows.append(("critic", "-", str(len(layout.critic)), _span(layout.critic) + " (the actor's)"))
    roles = layout.engine_roles or ("engine",) * len(layout.engines)
    for role in dict.fromkeys(roles):
        mine = [i for i, r in enumerate(roles) if r == role]
        slots = [s for i in mine for s in layout.engines[i]]
        rows.append(
            (
                role,
                f"{len(mine)} ({mine[0]}-{mine[-1]})" if len(mine) > 1 else f"1 ({mine[0]})",
                str(len(slots)),
                _span(slots),
            )
        )
    if layout.teacher:
        gpus = str(sum(s.gpu is not None for s in layout.teacher))
        rows.append(("teacher", "1", gpus, _span(layout.teacher) + " (engine 0's)"))
    widths = [max(len(r[k]) for r in rows) for k in range(3)]
    return [" ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + " " + r[3] for r in rows]


def _check_counts(spec: Spec) -> LayoutCounts:
    """The layout's counts, after refusing a trainer or rollout that does not fit the cluster."""
    c, t, r = spec.cluster, spec.train, spec.rollout
    gpn = c.gpus_per_node
    if (t.gpus_per_node or 0) > gpn:
        raise LayoutError(
            f"train.gpus_per_node={t.gpus_per_node} exceeds cluster.gpus_per_node={gpn}",
            path="train.gpus_per_node",
            hint=f"set train.gpus_per_node <= {gpn}",
        )
    if t.nodes > c.nodes:
        raise LayoutError(
            f"train.nodes={t.nodes} exceeds cluster.nodes={c.nodes}",
            path="train.nodes",
            hint=f"set train.nodes <= {c.nodes} or raise cluster.nodes",
        )
    n = layout_counts(spec)
    mode = "colocated: max(actor, rollout)" if r.colocate else "disaggregated: actor + rollout"
    if n.total > n.available:
        # The actor alone always fits (both checks above), so rollout.gpus is what overflows.
        raise LayoutError(
            f"rollout.gpus={n.rollout_gpus} does not fit: the layout needs {n.total} GPUs ({mode}; actor = "
            f"train.nodes {t.nodes} x train.gpus_per_node {t.gpus_per_node} = {n.actor_gpus}, rollout.gpus = "
            f"{n.rollout_gpus}) but the cluster has {n.available} (cluster.nodes {c.nodes} x cluster.gpus_per_node "
            f"{gpn})",
            path="rollout.gpus",
            hint=f"set rollout.gpus <= {n.available if r.colocate else n.available - n.actor_gpus}"
            + ("" if r.colocate else " or lower train.nodes/train.gpus_per_node")
            + ", or raise cluster.nodes",
        )
    return n


def _engine_pool(spec: Spec, actor: tuple[Slot, ...], n: LayoutCounts) -> list[Slot]:
    """The slots engines take, in order: the actor's first when colocated, else the free ones after it."""
    gpn, actor_set = spec.cluster.gpus_per_node, set(actor)
    if spec.rollout.colocate:
        rest = (Slot(node=i // gpn, gpu=i % gpn) for i in range(n.total))
        return list(actor) + [s for s in rest if s not in actor_set]
    # Engines take the first free slots after the actor's, node by node; with
    # train.gpus_per_node < cluster.gpus_per_node the actor's slots are not a flat prefix.
    free = (Slot(node=i // gpn, gpu=i % gpn) for i in range(n.available))
    return [s for s in free if s not in actor_set][: n.rollout_gpus]


def _engine_slots(i: int, slots: tuple[Slot, ...], gpe: int, gpn: int) -> tuple[Slot, ...]:
    """Engine ``i``'s slots; refused where it would straddle nodes it does not cover fully."""
    per_node = {nd: sum(1 for s in slots if s.node == nd) for nd in sorted({s.node for s in slots})}
    # The preflight's condition on the actual slots: every node the engine touches is fully covered.
    if len(per_node) > 1 and any(k != gpn for k in per_node.values()):
        used = ", ".join(f"{k} on node{nd}" for nd, k in per_node.items())
        raise LayoutError(
            f"engine {i} ({gpe} GPUs) would straddle nodes {list(per_node)} starting at {slots[0]} ({used}): "
            f"an engine must fit in one node or cover all {gpn} GPUs of every node it spans",
            path="rollout.gpus_per_engine",
            hint="make rollout.gpus_per_engine divide cluster.gpus_per_node (or a multiple of it) and the "
            "actor's GPUs fill whole nodes (train.gpus_per_node = cluster.gpus_per_node)",
        )
    return slots
