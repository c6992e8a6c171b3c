"""The preflight's decisions and report, without Ray: pure functions of what the nodes reported.

* :func:`gpu_visibility` — GPU count against the spec (``nvidia-smi``/torch on real GPU nodes,
  SLURM's GRES count where there is no driver, as in CI) and CUDA_VISIBLE_DEVICES against
  SLURM's allocation (the same ids, or 0..n-1 when device cgroups renumber them).
* :func:`ray_resources` — what Ray registered per node against what the bootstrap gave it,
  the spec, and the slots the layout puts there.
* :func:`role_conflicts` — no physical GPU shared by non-colocated roles; engines inside a node
  unless they span whole nodes; (node, GPU) pairs distinct.
* :func:`render_table` / :func:`write_report` — ``preflight.json`` and the rich table
  (node, IP, GPUs, roles) in ``preflight.txt``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from slime.core.paths import TaskPaths, atomic_write
from slime.spec.layout import Layout

__all__ = [
    "Check",
    "PreflightResult",
    "gpu_visibility",
    "parse_ids",
    "ray_resources",
    "render_table",
    "role_conflicts",
    "write_report",
]


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


def gpu_visibility(host: str, expected: int, probe: dict[str, Any]) -> list[Check]:
    """gpu_count and cuda_visible_devices checks from one node probe."""
    cvd = probe.get("cuda_visible_devices")
    slurm_ids = parse_ids(probe.get("slurm_gpus"))
    checks = []
    if probe.get("nvidia_smi") is not None:
        seen = len(parse_ids(cvd)) if cvd is not None else probe["nvidia_smi"]
        source = "CUDA_VISIBLE_DEVICES" if cvd is not None else "nvidia-smi"
        extra = []
        if probe["nvidia_smi"] < seen:
            extra.append(f"nvidia-smi lists only {probe['nvidia_smi']}")
        if probe.get("torch_cuda") is not None and probe["torch_cuda"] != seen:
            extra.append(f"torch.cuda sees {probe['torch_cuda']}")
        ok = seen == expected and not extra
    elif probe.get("slurm_gpus_on_node"):
        seen, source, extra = int(probe["slurm_gpus_on_node"]), "SLURM GRES (no nvidia-smi)", []
        ok = seen == expected
    else:
        seen, source, extra = 0, "none (no nvidia-smi, no SLURM GRES)", []
        ok = expected == 0
    msg = f"{seen} GPU(s) via {source}, spec wants {expected}" + (f"; {'; '.join(extra)}" if extra else "")
    checks.append(
        Check(
            name="gpu_count",
            ok=ok,
            node=host,
            message=msg,
            fix=None
            if ok
            else "check the node's GPUs/driver (nvidia-smi), or set cluster.gpus_per_node "
            "to what the nodes have; exclude a broken node with cluster.exclude",
        )
    )
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


def role_conflicts(layout: Layout, placement_rows: list[dict[str, Any]]) -> list[Check]:
    """Non-colocated roles must not share a physical GPU; engines stay in one node unless spanning whole nodes."""
    checks: list[Check] = []
    phys = {row["slot"]: (row["host"], row["gpu"]) for row in placement_rows}
    pairs = list(phys.values())
    dup = sorted({p for p in pairs if pairs.count(p) > 1 and p[1] is not None})
    checks.append(
        Check(
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
    )
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
        checks.append(
            Check(
                name="roles",
                ok=True,
                message="roles do not share GPUs across non-colocated roles; "
                "engines stay within a node or span whole nodes",
            )
        )
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
    for col in ("node", "IP", "GPUs", "roles", "status"):
        table.add_column(col)
    for n in report.get("nodes", []):
        roles = "; ".join(f"{'gpu' + g if g != 'cpu' else 'cpu'}: {', '.join(r) or '-'}" for g, r in n["roles"].items())
        table.add_row(
            f"{n['host']} (rank {n['rank']})",
            str(n.get("ip") or "?"),
            ",".join(n["gpus"]) or "-",
            roles or "-",
            "FAIL" if n["host"] in bad else "ok",
        )
    buf = io.StringIO()
    con = Console(file=buf, width=120, highlight=False, color_system=None)
    con.print(table)
    for c in report.get("checks", []):
        mark = "ok  " if c["ok"] else "FAIL"
        con.print(
            f"  {mark} {c['name']}{' [' + c['node'] + ']' if c.get('node') else ''}: {c['message']}", markup=False
        )
        if not c["ok"] and c.get("fix"):
            con.print(f"       fix: {c['fix']}", markup=False)
    return buf.getvalue()


def write_report(tp: TaskPaths, report: dict[str, Any]) -> str:
    """Write preflight.json and preflight.txt; return the table text."""
    text = render_table(report)
    atomic_write(tp.preflight_json, json.dumps(report, indent=2, default=str) + "\n")
    atomic_write(tp.preflight_txt, text)
    return text
