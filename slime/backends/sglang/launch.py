"""The exact ``sglang.launch_server`` / ``sglang_router`` commands a spec runs, one per engine process.

Pure and deterministic (no I/O but reading ``config.json`` for ``--trust-remote-code``; no SGLang import),
so ``slime-submit render`` prints the argv the runtime executes and golden tests pin it. Flags derive from
the spec and layout (model, TP size, GPU ids, host and ports, multi-node rendezvous, memory saver,
deterministic inference, prefill/decode role), then ``rollout.sglang.args`` and a role's own args verbatim;
a key that would override a derived flag or break the placement is rejected. Several regular engines get a
router on the first node; prefill/decode groups none (the rollout manager pairs their requests). Without
``hosts`` commands render ``node0``... and default ports (the runtime takes a per-job block). docs/design-notes.md.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.backends.sglang.flags import EP_FLAGS, PP_FLAGS, SGLANG_RESERVED, engine_pp, engine_tp, reserved_hint

if TYPE_CHECKING:
    from slime.spec.layout import Layout
    from slime.spec.types import Spec

__all__ = [
    "ENGINE_PORT_BASE",
    "PORT_STRIDE",
    "ROUTER_PORT",
    "EngineCommand",
    "LaunchError",
    "RouterCommand",
    "engine_commands",
    "flags_from_args",
    "port_blocks",
    "render_engine_commands",
    "router_command",
]

ROUTER_PORT = 30000
ENGINE_PORT_BASE = 30010
PORT_STRIDE = 10  # http, http+1 = nccl, http+2 = multi-node dist-init, http+3 = a prefill engine's bootstrap
BOOTSTRAP_OFFSET = 3  # SGLang's default bootstrap port (8998) would clash between prefill engines on a node
ENGINE_PORT_RANGE = (10000, 20000)  # below Ray's default 20000-32000 and Linux's ephemeral 32768-60999
_ENGINE_RESERVED = SGLANG_RESERVED  # one table with validate (slime.backends.sglang.flags)
_ROUTER_RESERVED = ("worker-urls", "host", "port")


class LaunchError(ValueError):
    """The spec cannot be turned into engine commands; names the field and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineCommand:
    """One server process of engine ``engine`` (``node_rank`` > 0 only for engines spanning nodes)."""

    engine: int
    node_rank: int
    nnodes: int
    node: int
    host: str
    gpus: tuple[int, ...]
    port: int | None
    argv: tuple[str, ...]
    ports: tuple[int, ...] = ()  # every port it binds on its node (checked free before launch)
    env: Mapping[str, str] = field(default_factory=dict)
    role: str = ""  # 'prefill' / 'decode' (rollout.sglang.pd), '' for a regular engine
    bootstrap_port: int | None = None  # a prefill engine's KV bootstrap server (each paired request names it)

    @property
    def url(self) -> str | None:
        return None if self.port is None else f"http://{self.host}:{self.port}"

    def render(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterCommand:
    host: str
    port: int
    argv: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def render(self) -> str:
        return shlex.join(self.argv)


def _norm(key: str) -> str:
    return key.strip().lstrip("-").replace("_", "-")


def flags_from_args(args: Mapping[str, Any], *, field_name: str, reserved: Sequence[str] = ()) -> list[str]:
    """``{key: value}`` → argv flags (conversion rules: docs/design-notes.md, slime.backends.sglang.launch)."""
    out: list[str] = []
    for key, value in args.items():
        if not isinstance(key, str) or not key.strip().lstrip("-"):
            raise LaunchError(f"{field_name}: empty or non-string key {key!r}")
        if "=" in key:
            raise LaunchError(f"{field_name}.{key}: a key must not contain '='; write the value as the key's value")
        # argparse accepts any unambiguous prefix of a flag (allow_abbrev), so prefixes are reserved too
        hit = next((r for r in reserved if r.startswith(_norm(key))), None)
        if hit is not None:
            abbr = "" if hit == _norm(key) else f" (--{_norm(key)} abbreviates it)"
            instead = "change " + reserved_hint(hit)
            raise LaunchError(
                f"{field_name}.{key}: slime sets --{hit} itself from the spec and layout{abbr}; "
                f"remove it ({instead} instead)"
            )
        flag = "--" + key.strip().lstrip("-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (str, int, float)):
            out += [flag, str(value)]
        else:
            raise LaunchError(f"{field_name}.{key}: value {value!r} must be a string, number, true/false or null")
    return out


def _needs_remote_code(model_path: str | None) -> bool:
    try:
        return "auto_map" in json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def _tp_size(spec: Spec) -> int:
    gpe, args = spec.rollout.gpus_per_engine, spec.rollout.sglang.args
    tp = engine_tp(gpe, args)
    if tp is None:
        key, value = engine_pp(args)
        raise LaunchError(
            f"rollout.sglang.args.{key}={value!r} must be a positive integer dividing rollout.gpus_per_engine={gpe}"
        )
    for key, value in spec.rollout.sglang.args.items():
        if _norm(key) in EP_FLAGS and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1 or tp % value
        ):
            # SGLang splits each engine's tensor-parallel ranks into ep x (tp / ep) for the MoE layers
            raise LaunchError(
                f"rollout.sglang.args.{key}={value!r} must be a positive integer dividing the engine's "
                f"tensor-parallel size {tp}"
            )
    return tp


def _shared_argv(spec: Spec, python: str, extra: list[str]) -> tuple[list[str], list[str]]:
    """(the launch_server argv every engine process starts with, the flags derived from the spec)."""
    r = spec.rollout
    common = [python, "-m", "sglang.launch_server", "--model-path", spec.model.path, "--tp-size", str(_tp_size(spec))]
    if spec.model.tokenizer and spec.model.tokenizer != spec.model.path:
        common += ["--tokenizer-path", spec.model.tokenizer]
    derived: list[str] = []
    if _needs_remote_code(spec.model.path) and "--trust-remote-code" not in extra:
        derived.append("--trust-remote-code")
    if r.colocate and "--enable-memory-saver" not in extra:
        derived.append("--enable-memory-saver")
    if r.deterministic:  # SGLang ignores a request's sampling_seed without it (0.5.23)
        derived.append("--enable-deterministic-inference")
    return common, derived


def _engine_processes(
    engine: int, slots, port: int, hosts: list[str], head: list[str], tail: list[str], role: str = ""
):
    """One EngineCommand per node of one engine; node rank 0 serves HTTP, the others join it."""
    nodes = sorted({s.node for s in slots})
    first = nodes[0]
    boot = port + BOOTSTRAP_OFFSET if role == "prefill" else None
    out: list[EngineCommand] = []
    for rank, node in enumerate(nodes):
        gpus = tuple(s.gpu for s in slots if s.node == node)
        argv = list(head) + ["--base-gpu-id", str(gpus[0])]
        if rank == 0:
            argv += ["--host", hosts[node], "--port", str(port), "--nccl-port", str(port + 1)]
        if len(nodes) > 1:
            argv += [
                "--nnodes",
                str(len(nodes)),
                "--node-rank",
                str(rank),
                "--dist-init-addr",
                f"{hosts[first]}:{port + 2}",
            ]
        if boot:  # on every node rank: the engine's processes share their server arguments
            argv += ["--disaggregation-bootstrap-port", str(boot)]
        out.append(
            EngineCommand(
                engine=engine,
                node_rank=rank,
                nnodes=len(nodes),
                node=node,
                host=hosts[node],
                gpus=gpus,
                port=port if rank == 0 else None,
                ports=((port, port + 1) + ((boot,) if boot else ())) if rank == 0 else (),
                argv=tuple(argv + tail),
                role=role,
                bootstrap_port=boot,
            )
        )
    return out


def engine_commands(
    spec: Spec,
    layout: Layout | None = None,
    *,
    hosts: Sequence[str] | None = None,
    port_base: int = ENGINE_PORT_BASE,
    python: str = "python",
) -> list[EngineCommand]:
    """Every engine process of the spec, engine by engine (node rank 0 first)."""
    from slime.spec.layout import plan_layout

    r = spec.rollout
    if r.backend != "sglang":
        raise LaunchError(f"rollout.backend is {r.backend!r}; SGLang commands exist only for 'sglang'")
    if not spec.model.path:
        raise LaunchError("model.path is required for SGLang engines (a built-in model cannot be served by SGLang)")
    layout = layout or plan_layout(spec)
    if layout.cpu_only:
        raise LaunchError("SGLang engines need GPUs: cluster.gpus_per_node is 0")
    hosts = list(hosts) if hosts is not None else [f"node{i}" for i in range(layout.nodes)]
    if len(hosts) < layout.nodes:
        raise LaunchError(f"{len(hosts)} host address(es) given for {layout.nodes} node(s)")
    extra = flags_from_args(r.sglang.args, field_name="rollout.sglang.args", reserved=_ENGINE_RESERVED)
    common, derived = _shared_argv(spec, python, extra)
    tails = dict.fromkeys(("", *layout.engine_roles), derived + extra)
    if r.sglang.pd is not None:
        tails = {role: derived + _role_flags(spec, role) + extra + _role_args(spec, role) for role in tails}
    per_node: dict[int, int] = {}  # engines already on each node: picks the port slot
    out: list[EngineCommand] = []
    for i, slots in enumerate(layout.engines):
        nodes = sorted({s.node for s in slots})
        j = per_node.get(nodes[0], 0)
        for n in nodes:
            per_node[n] = per_node.get(n, 0) + 1
        role = layout.engine_roles[i] if layout.engine_roles else ""
        out += _engine_processes(i, slots, port_base + PORT_STRIDE * j, hosts, common, tails[role], role)
    return out


def _role_flags(spec: Spec, role: str) -> list[str]:
    """A prefill or decode engine's SGLang mode and KV transfer (rollout.sglang.pd); none for a regular one."""
    pd = spec.rollout.sglang.pd
    if pd is None or role not in ("prefill", "decode"):
        return []
    out = ["--disaggregation-mode", role, "--disaggregation-transfer-backend", pd.transfer]
    return out + (["--disaggregation-ib-device", pd.ib_device] if pd.ib_device else [])


def _role_args(spec: Spec, role: str) -> list[str]:
    """``rollout.sglang.pd.<role>_args`` as flags; the engine's shape (pp, ep) is shared, so set in args only."""
    pd = spec.rollout.sglang.pd
    if pd is None or role not in ("prefill", "decode"):
        return []
    return flags_from_args(
        pd.prefill_args if role == "prefill" else pd.decode_args,
        field_name=f"rollout.sglang.pd.{role}_args",
        reserved=(*_ENGINE_RESERVED, *PP_FLAGS, *EP_FLAGS),
    )


def router_command(
    spec: Spec, engine_urls: Sequence[str], *, host: str, port: int = ROUTER_PORT, python: str = "python"
) -> RouterCommand | None:
    """The sglang-router in front of several engines (None for a single engine)."""
    if len(engine_urls) < 2:
        return None
    extra = flags_from_args(
        spec.rollout.sglang.router_args, field_name="rollout.sglang.router_args", reserved=_ROUTER_RESERVED
    )
    argv = [
        python,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--worker-urls",
        *engine_urls,
        *extra,
    ]
    return RouterCommand(host=host, port=port, argv=tuple(argv))


def port_blocks(key: str) -> Iterator[int]:
    """Bases of the candidate engine port blocks of the job ``key``, its own first (``slime.core.ports.candidates``
    over ``$SLIME_ENGINE_PORT_RANGE``, which must lie outside ``$SLIME_RAY_PORT_RANGE``)."""
    from slime.core.ports import BLOCK, candidates, port_range

    low, high = ENGINE_PORT_RANGE
    text = os.environ.get("SLIME_ENGINE_PORT_RANGE", "").strip()
    if text:
        try:
            low, high = (int(x) for x in text.split("-"))
        except ValueError:
            raise LaunchError(f"SLIME_ENGINE_PORT_RANGE={text!r}: expected LOW-HIGH, e.g. 10000-20000") from None
        if not (low >= 1024 and high <= 65536 and high - low >= BLOCK):
            raise LaunchError(
                f"SLIME_ENGINE_PORT_RANGE={text!r}: need 1024 <= LOW, HIGH <= 65536 and at least {BLOCK} ports"
            )
    ray_low, ray_high = port_range()
    if low < ray_high and ray_low < high:
        raise LaunchError(
            f"engine ports {low}-{high} (SLIME_ENGINE_PORT_RANGE) overlap Ray's {ray_low}-{ray_high} "
            f"(SLIME_RAY_PORT_RANGE); set SLIME_ENGINE_PORT_RANGE to a range outside it"
        )
    for block in candidates(key, (low, high)):
        yield block.base


def render_engine_commands(spec: Spec, hosts: Sequence[str] | None = None) -> str:
    """Human-readable listing of the layout, every engine command and the router (what ``render`` prints)."""
    from slime.spec.layout import layout_table, plan_layout

    layout = plan_layout(spec)
    cmds = engine_commands(spec, layout, hosts=hosts)
    r = spec.rollout
    pd = r.sglang.pd
    lines = [
        f"# SGLang rollout engines for {spec.name}: {len(layout.engines)} engine(s) x {r.gpus_per_engine} "
        f"GPU(s), {'colocated with' if r.colocate else 'beside'} training"
        + (f"; prefill/decode groups, KV transfer {pd.transfer}" if pd else ""),
        *(f"#   {line}" for line in layout_table(layout)),
        f"# node addresses: {', '.join(hosts or [f'node{i}' for i in range(layout.nodes)])}"
        + ("" if hosts else " (placeholders: the runtime substitutes each node's address)"),
    ]
    for c in cmds:
        gpus = f"GPU {c.gpus[0]}" if len(c.gpus) == 1 else f"GPUs {c.gpus[0]}-{c.gpus[-1]}"
        rank = f"node rank {c.node_rank}/{c.nnodes}, " if c.nnodes > 1 else ""
        where = f"url {c.url}" if c.url else "no HTTP server (joins node rank 0)"
        boot = f", KV bootstrap port {c.bootstrap_port}" if c.bootstrap_port and c.url else ""
        name = f"{c.role} engine" if c.role else "engine"
        lines += [f"# {name} {c.engine} ({rank}node{c.node} {gpus}) {where}{boot}", c.render()]
    if pd:
        lines.append(
            "# no router: the rollout manager sends each request to a decode engine and a prefill engine at once "
            "(its host and KV bootstrap port, one bootstrap room)"
        )
    elif router := router_command(spec, [c.url for c in cmds if c.url], host=(hosts or ["node0"])[0]):
        lines += [f"# router on node0, url {router.url}", router.render()]
    return "\n".join(lines) + "\n"
