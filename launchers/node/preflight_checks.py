"""The preflight's decisions and report, without Ray: pure functions of what the nodes reported.

:func:`gpu_visibility` (GPU count and CUDA_VISIBLE_DEVICES against the spec and SLURM),
:func:`cuda_checks` (one failing check per node with a broken or silent bundle),
:func:`ray_resources` (what Ray registered against what was given and needed),
:func:`role_conflicts` (no GPU shared by non-colocated roles, engines within a node unless whole
nodes) and :func:`render_table` / :func:`write_report` (``preflight.json``, ``preflight.txt``).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from slime.core.paths import TaskPaths, atomic_write
from slime.spec.layout import Layout

__all__ = [
    "SOLO_SKIP",
    "Check",
    "PreflightResult",
    "cuda_checks",
    "gpu_visibility",
    "needs_collective",
    "parse_ids",
    "ray_resources",
    "render_table",
    "role_conflicts",
    "write_report",
]

SOLO_SKIP = "one node without GPUs: no peer to all_reduce with, no GPU to count"


def needs_collective(num_nodes: int, gpus_per_node: int) -> bool:
    """Whether the job's nodes run the collective subprocess (``launchers.node.collective``): not for one node
    without GPUs, where it would only spend CPU importing torch to all_reduce with itself."""
    return num_nodes > 1 or gpus_per_node > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    name: str
    ok: bool
    message: str
    node: str | None = None  # hostname the check is about (None: the whole job)
    fix: str | None = None


@dataclass(kw_only=True)
class PreflightResult:
    ok: bool
    checks: list[Check]
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def bad_nodes(self) -> list[str]:
        return sorted({c.node for c in self.checks if not c.ok and c.node})

    @property
    def error(self) -> str:
        bad = [c for c in self.checks if not c.ok]
        return "; ".join(
            f"{c.name}{' on ' + c.node if c.node else ''}: {c.message}" + (f" (fix: {c.fix})" if c.fix else "")
            for c in bad
        )


def parse_ids(text: str | None) -> list[str]:
    """'0, 1,2' -> ['0', '1', '2'] (CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS)."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


_NO_CUDA_FIX = (
    "check the node's NVIDIA driver and torch's CUDA build (nvidia-smi; python -c 'import torch; "
    "print(torch.cuda.is_available())'), or exclude the node with cluster.slurm.exclude; if this cluster's GPUs "
    "are placeholders (a test cluster's fake GRES), set cluster.fake_gpus: true to run on CPU"
)


def gpu_visibility(host: str, expected: int, probe: dict[str, Any], *, fake_gpus: bool = False) -> list[Check]:
    """gpu_count and cuda_visible_devices checks from one node probe (``fake_gpus``: cluster.fake_gpus)."""
    cvd = probe.get("cuda_visible_devices")
    slurm_ids = parse_ids(probe.get("slurm_gpus"))
    torch_cuda = probe.get("torch_cuda")
    checks = []
    fix = (
        "check the node's GPUs/driver (nvidia-smi), or set cluster.gpus_per_node "
        "to what the nodes have; exclude a broken node with cluster.slurm.exclude"
    )
    if fake_gpus:
        gres = probe.get("slurm_gpus_on_node")
        seen = int(gres) if gres else expected
        source = "SLURM GRES" if gres else "the spec (no SLURM GRES)"
        extra = ["fake GPUs (cluster.fake_gpus): CUDA not checked, trainers and engines run on CPU"]
        ok = seen == expected
    elif probe.get("nvidia_smi") is not None or torch_cuda:
        smi = probe.get("nvidia_smi")
        seen = len(parse_ids(cvd)) if cvd is not None else (smi if smi is not None else torch_cuda)
        source = "CUDA_VISIBLE_DEVICES" if cvd is not None else ("nvidia-smi" if smi is not None else "torch.cuda")
        extra = []
        if smi is not None and smi < seen:
            extra.append(f"nvidia-smi lists only {smi}")
        if torch_cuda is not None and torch_cuda != seen:
            extra.append(f"torch.cuda sees {torch_cuda}")
        ok = seen == expected and not extra
        if torch_cuda == 0 and expected:
            fix = _NO_CUDA_FIX
    elif expected:
        gres = probe.get("slurm_gpus_on_node")
        seen, source = 0, "torch.cuda (no nvidia-smi)"
        extra = [f"no CUDA on this node{f' although SLURM GRES gives it {gres} GPU(s)' if gres else ''}"]
        ok, fix = False, _NO_CUDA_FIX
    else:
        seen, source, extra = 0, "none (no nvidia-smi, no CUDA)", []
        ok = True
    msg = f"{seen} GPU(s) via {source}, spec wants {expected}" + (f"; {'; '.join(extra)}" if extra else "")
    checks.append(Check(name="gpu_count", ok=ok, node=host, message=msg, fix=None if ok else fix))
    if slurm_ids:
        cvd_ids = parse_ids(cvd)
        renumbered = [str(i) for i in range(len(slurm_ids))]
        ok = cvd is not None and (cvd_ids in (slurm_ids, renumbered))
        checks.append(
            Check(
                name="cuda_visible_devices",
                ok=ok,
                node=host,
                message=f"CUDA_VISIBLE_DEVICES={cvd!r}, SLURM allocated GPUs {','.join(slurm_ids)}",
                fix=None
                if ok
                else "do not set CUDA_VISIBLE_DEVICES yourself (cluster.env or the submitting shell); let SLURM set it",
            )
        )
    return checks


def cuda_checks(results: list[dict[str, Any]], bundles: list[tuple[int, str]]) -> list[Check]:
    """The CUDA probes' answers (``cuda_probe`` dicts) for the GPU ``bundles`` ((index, host) pairs): one
    failing ``cuda`` check per node with a broken or silent bundle, else one passing check."""
    by_bundle = {r["bundle"]: r for r in results}
    bad: dict[str, list[str]] = {}
    for index, host in bundles:
        r = by_bundle.get(index)
        if r is None:
            bad.setdefault(host, []).append(f"bundle {index}: no answer within the timeout")
        elif "error" in r:
            gpus = ",".join(r.get("gpu_ids") or []) or "?"
            bad.setdefault(r.get("host") or host, []).append(f"bundle {index} (GPU {gpus}): {r['error']}")
    if bad:
        return [
            Check(
                name="cuda",
                ok=False,
                node=host,
                message=f"CUDA fails on {len(problems)} GPU slot(s) of {host}: " + "; ".join(problems),
                fix=_NO_CUDA_FIX,
            )
            for host, problems in sorted(bad.items())
        ]
    names = sorted({r["device_name"] for r in results if r.get("device_name")})
    return [
        Check(
            name="cuda",
            ok=True,
            message=f"CUDA works on all {len(bundles)} GPU slot(s) on {len({h for _, h in bundles})} node(s)"
            + (f" ({', '.join(names)})" if names else "")
            + ": torch sees the bundle's GPU, CUDA_VISIBLE_DEVICES matches Ray's, a tensor op ran",
        )
    ]


def _distinct_slots(pairs: list[tuple[str, Any]]) -> Check:
    dup = sorted({p for p in pairs if pairs.count(p) > 1 and p[1] is not None})
    return Check(
        name="placement",
        ok=not dup,
        message=f"{len(pairs)} slot(s) on distinct (node, GPU) pairs"
        if not dup
        else f"(node, GPU) pairs used by more than one slot: {dup}",
        node=dup[0][0] if dup else None,
        fix=None
        if not dup
        else "Ray gave two bundles the same GPU: check that the node's CUDA_VISIBLE_DEVICES lists distinct GPUs",
    )


def _roles_ok(layout: Layout) -> Check:
    roles = layout.engine_roles  # engine groups (SGLang prefill/decode): their GPUs on the checked bundles
    groups = "; engine groups: " + ", ".join(
        f"{r} {roles.count(r)} engine(s), {sum(len(e) for e, q in zip(layout.engines, roles) if q == r)} GPU(s)"
        for r in dict.fromkeys(roles)
    )
    return Check(
        name="roles",
        ok=True,
        message="roles do not share GPUs across non-colocated roles; "
        "engines stay within a node or span whole nodes" + (groups if roles else ""),
    )


def role_conflicts(layout: Layout, placement_rows: list[dict[str, Any]]) -> list[Check]:
    """Non-colocated roles must not share a physical GPU; engines stay in one node unless spanning whole nodes."""
    phys = {row["slot"]: (row["host"], row["gpu"]) for row in placement_rows}
    checks = [_distinct_slots(list(phys.values()))]
    if layout.cpu_only:
        return checks
    if not layout.colocate:
        actor = {phys[str(s)] for s in layout.actor}
        for i, engine in enumerate(layout.engines):
            shared = sorted(actor & {phys[str(s)] for s in engine})
            if shared:
                checks.append(
                    Check(
                        name="roles",
                        ok=False,
                        node=shared[0][0],
                        message=f"engine {i} shares GPU(s) {shared} with the actor in a disaggregated layout",
                        fix="set rollout.colocate: true, or give the engines their own GPUs",
                    )
                )
    gpn = layout.gpus_per_node
    for i, engine in enumerate(layout.engines):
        hosts = sorted({phys[str(s)][0] for s in engine})
        whole = len(engine) % gpn == 0 and len(engine) == len(hosts) * gpn
        if len(hosts) > 1 and not whole:
            checks.append(
                Check(
                    name="roles",
                    ok=False,
                    node=hosts[0],
                    message=f"engine {i} spans nodes {hosts} without filling them",
                    fix="make rollout.gpus_per_engine divide cluster.gpus_per_node",
                )
            )
    if not any(c.name == "roles" for c in checks):
        checks.append(_roles_ok(layout))
    return checks


def ray_resources(
    host: str, registered: dict[str, float], meta: dict[str, Any], spec_gpus: int, slots_here: int
) -> Check:
    """Ray's CPU/GPU for a node against the bootstrap's numbers, the spec and the slots placed there."""
    cpu, gpu = registered.get("CPU", 0), registered.get("GPU", 0)
    problems = []
    if gpu != spec_gpus:
        problems.append(f"GPU {gpu:g} != cluster.gpus_per_node {spec_gpus}")
    if meta.get("num_gpus") is not None and gpu != meta["num_gpus"]:
        problems.append(f"GPU {gpu:g} != the {meta['num_gpus']} the bootstrap gave Ray")
    if meta.get("num_cpus") is not None and cpu != meta["num_cpus"]:
        problems.append(f"CPU {cpu:g} != the {meta['num_cpus']} the bootstrap gave Ray")
    if cpu < slots_here:
        problems.append(f"CPU {cpu:g} < the {slots_here} slot(s) placed on this node")
    return Check(
        name="ray_resources",
        ok=not problems,
        node=host,
        message=f"Ray registered CPU {cpu:g}, GPU {gpu:g}" + (": " + "; ".join(problems) if problems else ""),
        fix=None
        if not problems
        else "set cluster.cpus_per_node to at least one CPU per slot; check SLURM's GPU allocation on this node",
    )


# --------------------------------------------------------------------------- output
def render_table(report: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    bad = set(report.get("bad_nodes", []))
    title = (
        f"preflight {'PASSED' if report.get('ok') else 'FAILED'}: task {report.get('task')}, "
        f"job {report.get('job_id')}, {report.get('ray_nodes')} Ray node(s), {len(report.get('slots', []))} slot(s)"
    )
    table = Table(title=title, title_justify="left")
    for col in ("node", "IP", "GPUs", "CUDA", "roles", "status"):
        table.add_column(col)
    for n in report.get("nodes", []):
        roles = "; ".join(f"{'gpu' + g if g != 'cpu' else 'cpu'}: {', '.join(r) or '-'}" for g, r in n["roles"].items())
        table.add_row(
            f"{n['host']} (rank {n['rank']})",
            str(n.get("ip") or "?"),
            ",".join(n["gpus"]) or "-",
            n.get("cuda") or "-",
            roles or "-",
            "FAIL" if n["host"] in bad else "ok",
        )
    buf = io.StringIO()
    con = Console(file=buf, width=120, highlight=False, color_system=None)
    con.print(table)
    if report.get("external"):
        con.print(_external_table(report["external"]))
    if report.get("fake_gpus"):
        con.print(
            "  fake GPUs: running on CPU (cluster.fake_gpus: the GPU slots are placeholders; CUDA was not checked)",
            markup=False,
        )
    for c in report.get("checks", []):
        mark = "ok  " if c["ok"] else "FAIL"
        con.print(
            f"  {mark} {c['name']}{' [' + c['node'] + ']' if c.get('node') else ''}: {c['message']}", markup=False
        )
        if not c["ok"] and c.get("fix"):
            con.print(f"       fix: {c['fix']}", markup=False)
    return buf.getvalue()


def _external_table(rows: list[dict[str, Any]]) -> Any:
    """The engines the job did not start (``rollout.external``): one row each."""
    from rich.table import Table

    table = Table(title="external engines (no slots of this job)", title_justify="left")
    for col in ("address", "reachable", "model", "weights", "status"):
        table.add_column(col)
    for r in rows:
        reach = "yes" if r.get("reachable") else "no"
        table.add_row(r["address"], reach, str(r.get("model") or "-"), str(r.get("weights") or "-"), _ok(r))
    return table


def _ok(row: dict[str, Any]) -> str:
    return "ok" if row.get("ok") else "FAIL"


def write_report(tp: TaskPaths, report: dict[str, Any]) -> str:
    """Write preflight.json and preflight.txt; return the table text."""
    text = render_table(report)
    atomic_write(tp.preflight_json, json.dumps(report, indent=2, default=str) + "\n")
    atomic_write(tp.preflight_txt, text)
    return text
