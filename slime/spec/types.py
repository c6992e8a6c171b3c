"""The spec's types: ``slime.spec.sections`` with each installed plug-in's section composed in.

``Cluster``, ``Train`` and ``Rollout`` gain a field per plug-in that has options
(``cluster.slurm``, ``train.megatron``, ``rollout.sglang``, ...) and their name field becomes the
choice of the installed plug-ins, defaulting to the embedded default; ``Spec`` holds the composed
sections. Composed once at import from the entry points (``slime.spec.plugin``), so the schema,
``explain`` and the docs list exactly what is installed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.spec import sections as _base
from slime.spec.plugin import KINDS, group_entry_points, profiles
from slime.spec.sections import *  # noqa: F403  (the generic sections are the spec's types too)
from slime.spec.sections import D, Section


def _compose(base: type, kind: str) -> type:
    """``base`` with its plug-in name field narrowed to the installed plug-ins and their sections added."""
    _, section, attr = KINDS[kind]
    found = profiles(kind)
    default = next(n for n, p in found.items() if p.default)
    names = ", ".join(f"'{n}' ({p.summary})" for n, p in found.items())
    choice = Annotated[Literal[tuple(found)], D(f"{kind.replace('_', ' ').capitalize()}: {names}.")]
    fields: list[tuple] = [(attr, choice, default)]
    taken = set(base.__struct_fields__)
    for name, p in found.items():
        if p.options is None:
            continue
        if name in taken or not issubclass(p.options, Section):
            raise TypeError(
                f"plug-in {name!r}: its section must be a slime.spec.sections.Section not named like "
                f"a field of {section}"
            )
        doc = p.options_doc or f"Settings of the {name} {kind.replace('_', ' ')} (only when {section}.{attr}: {name})."
        fields.append((name, Annotated[p.options | None, D(doc)], None))
    return msgspec.defstruct(base.__name__, fields, bases=(base,), module=__name__, kw_only=True)


def _rewards() -> type:
    """``Reward`` with ``type`` narrowed to the installed rewards (entry points ``slime_submit.rewards``)."""
    names = tuple(sorted({ep.name for ep in group_entry_points("slime_submit.rewards")}))
    choice = Annotated[
        Literal[names], D(f"Reward function: {', '.join(names)} (remote: reward.url; custom: reward.custom).")
    ]
    return msgspec.defstruct(
        "Reward", [("type", choice, "exact")], bases=(_base.Reward,), module=__name__, kw_only=True
    )


def _factory(cls: type):
    return msgspec.field(default_factory=cls)


Cluster = _compose(_base.Cluster, "launcher")
Train = _compose(_base.Train, "train_backend")
Rollout = _compose(_base.Rollout, "rollout_backend")
Reward = _rewards()
Spec = msgspec.defstruct(
    "Spec",
    [
        (
            "cluster",
            Annotated[Cluster, D("Where the job runs and with what resources.")],
            msgspec.field(default_factory=Cluster),
        ),
        ("train", Annotated[Train, D("The trainer.")], _factory(Train)),
        ("rollout", Annotated[Rollout, D("Rollout generation.")], _factory(Rollout)),
        ("reward", Annotated[Reward, D("Reward function.")], _factory(Reward)),
    ],
    bases=(_base.Spec,),
    module=__name__,
    kw_only=True,
)
Spec.__doc__ = _base.Spec.__doc__
for _composed in (Cluster, Train, Rollout, Reward):
    _composed.__doc__ = getattr(_base, _composed.__name__).__doc__
