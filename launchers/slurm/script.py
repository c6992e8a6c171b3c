"""Render the batch script: readable, self-contained, every value quoted by ``launchers.quoting``.

Ours, not submitit's: it must be readable by its submitter, carry the requeue/signal settings
resilience relies on, and hold nothing spec-derived beyond quoted ``#SBATCH`` values and ``export``
lines (each task reads ``$RUN_DIR/tasks/$TASK/resolved.json``). Order: header, ``RUN_DIR``/``TASK``,
env and secret exports, signal forwarding, ``srun`` of ``launchers.node.bootstrap`` on every node,
wait, exit with the step's status; ``launchers.slurm.restarts`` runs before and after the step.
Container and site setup: ``launchers.slurm.site``. Not guaranteed: that the cluster can satisfy the
request (checked at submit by ``launchers.slurm.cluster``) or that the container runtime is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from launchers.quoting import check_env_name, check_single_line, export_line, q, sbatch_line
from launchers.slurm.site import setup_lines, wrapping
from slime.core.paths import RunPaths
from slime.spec import Problem, SpecError
from slime.spec.types import Spec

__all__ = ["DRIVER_PATTERN", "ScriptOptions", "dependency", "log_pattern", "render_script"]

DRIVER_PATTERN = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")

_SECRET_FUNCS = r"""# slime_secret_env NAME VAR: export NAME from the job's copy of VAR (sbatch passes the
# submitting shell's environment to the job); the value itself is never written here.
slime_secret_env() {
    if [[ -z ${!2+set} ]]; then
        echo "slime: secret $1: environment variable $2 is not set in the job; export it before slime-submit" >&2
        exit 3
    fi
    export "$1=${!2}"
}
# slime_secret_file NAME PATH: export NAME as the first line of PATH, whitespace-trimmed.
slime_secret_file() {
    local value=
    if [[ ! -r $2 ]]; then
        echo "slime: secret $1: cannot read file $2 on $(hostname)" >&2
        exit 3
    fi
    IFS= read -r value <"$2" || true
    value=${value#"${value%%[![:space:]]*}"}
    value=${value%"${value##*[![:space:]]}"}
    export "$1=$value"
}"""

_SIGNALS = r"""# Signals. USR1 comes signal_grace_s before the time limit (--signal=B:USR1@N) and, where the
# cluster gives preempted jobs grace time (SlurmctldParameters=preempt_send_user_signal), at
# preemption. It becomes a stop file that the bootstrap on node 0 turns into a USR1 to the
# driver alone: the runtime checkpoints at its next safe point and exits 75, and the job then
# requeues itself (below). Not `kill -USR1 <srun>`: slurmstepd would deliver that to every
# process of the step, and Ray's own processes die of it. TERM (scancel, scontrol requeue,
# preemption without grace) reaches every process of the job from SLURM itself; here it only
# adds a stop request, and before the step exists it ends the job.
got=
step_pid=
on_signal() {
    got=$1
    if [[ $1 == TERM && -z $step_pid ]]; then
        echo "slime: task $TASK finished with exit code 143"
        exit 143
    fi
    mkdir -p "$RUN_DIR/tasks/$TASK/rendezvous" &&
        : >"$RUN_DIR/tasks/$TASK/rendezvous/stop-${SLURM_JOB_ID:-0}.${SLURM_RESTART_COUNT:-0}" || true
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM"""

_RESTARTS = r"""# Restarts (python -m launchers.slurm.restarts): record why this run is a restart and refuse to
# run once cluster.slurm.max_requeues / cluster.slurm.max_failures are spent; after the step, requeue this
# job when it stopped for a checkpoint (exit 75) or failed within cluster.slurm.max_failures.
slime_restarts() {
    local what=$1
    shift
    "${SLIME_HELPER[@]}" -m launchers.slurm.restarts "$what" "$RUN_DIR" --task "$TASK" "$@"
}
if ! slime_restarts start; then
    echo "slime: task $TASK finished with exit code 3"
    exit 3
fi"""

_WAIT = r'''step_pid=$!
# A trapped signal makes `wait` return early: wait again until the step has really exited.
while kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid" || true; done
rc=0
wait "$step_pid" || rc=$?
# srun gives the highest exit code of the step's tasks; the head's own (it records it) is the job's.
if [[ $rc != 0 ]] && head_rc=$(slime_restarts step-rc --rc "$rc") && [[ $head_rc =~ ^[0-9]+$ ]]; then
    rc=$head_rc
fi
echo "slime: task $TASK finished with exit code $rc"
if [[ $rc != 0 ]]; then slime_restarts after --rc "$rc" --signal "$got" || true; fi
exit "$rc"'''


@dataclass(frozen=True, kw_only=True, slots=True)
class ScriptOptions:
    """What is rendered besides the spec."""

    run_dir: Path
    n_tasks: int = 1
    preflight_only: bool = False
    python: str = "python3"
    driver: str | None = None  # python module run after the preflight (default: slime.train)


def _reject(field: str, message: str, hint: str) -> SpecError:
    return SpecError([Problem(path=field, message=message, hint=hint)])


def log_pattern(run_dir: Path, array: bool) -> str:
    """``--output`` path: ``<run>/logs/slurm-%A_%a.out`` (arrays) or ``slurm-%j.out``.

    SLURM expands ``%`` patterns in this path, so a literal ``%`` of the run dir is doubled;
    a backslash would switch all expansion off, so it is rejected.
    """
    logs = str(RunPaths(run_dir).logs)
    check_single_line(logs, "logging.dir")
    if "\\" in logs:
        raise _reject(
            "logging.dir",
            f"{logs!r} contains a backslash, which makes SLURM ignore the %j pattern of the job's log path",
            "use a directory path without backslashes",
        )
    name = "slurm-%A_%a.out" if array else "slurm-%j.out"
    return logs.replace("%", "%%") + "/" + name


def gpu_request_line(spec: Spec) -> str:
    """The GPU request in the site's style (``cluster.slurm.gpu_request``), typed when ``gpu_type`` is set.

    One task per node, so ``--gpus-per-task=N`` asks the same as ``--gpus-per-node=N`` where a site
    refuses the latter; the preflight checks what SLURM allocated (SLURM_GPUS_ON_NODE) whichever it is."""
    sl, n = spec.cluster.slurm, spec.cluster.gpus_per_node
    count = f"{sl.gpu_type}:{n}" if sl.gpu_type else str(n)
    if sl.gpu_request == "gres":
        return sbatch_line("gres", f"gpu:{count}", field="cluster.slurm.gpu_request")
    return sbatch_line(sl.gpu_request, count, field="cluster.slurm.gpu_request")


def dependency(spec: Spec) -> str | None:
    """``cluster.slurm.depends_on`` as sbatch's ``--dependency``: ``afterok:1:2,afterany:3`` (``,``: all of them)."""
    kinds: dict[str, list[str]] = {}
    for dep in spec.cluster.slurm.depends_on:
        kinds.setdefault("afterok" if dep.when == "ok" else "afterany", []).append(dep.job)
    return ",".join(f"{kind}:{':'.join(jobs)}" for kind, jobs in kinds.items()) or None


def _header(spec: Spec, opts: ScriptOptions) -> list[str]:
    c, sl = spec.cluster, spec.cluster.slurm
    array = spec.sweep is not None
    lines = [
        sbatch_line("job-name", spec.name, field="name"),
        sbatch_line("nodes", c.nodes, field="cluster.nodes"),
        sbatch_line("ntasks-per-node", 1, field="cluster.nodes"),
    ]
    if c.gpus_per_node:
        lines.append(gpu_request_line(spec))
    # Unset cpus_per_node: one CPU per device slot, the least the placement group needs.
    cpus = c.cpus_per_node or max(1, c.gpus_per_node)
    lines.append(sbatch_line("cpus-per-task", cpus, field="cluster.cpus_per_node"))
    if sl.mem:
        lines.append(sbatch_line("mem", sl.mem, field="cluster.slurm.mem"))
    if sl.time_limit:
        lines.append(sbatch_line("time", sl.time_limit, field="cluster.slurm.time_limit"))
    for name in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(sl, name)
        if value is not None:
            lines.append(sbatch_line(name, value, field=f"cluster.slurm.{name}"))
    if sl.exclude:
        for i, node in enumerate(sl.exclude):
            if "," in node or not node.strip():
                raise _reject(
                    f"cluster.slurm.exclude[{i}]",
                    f"{node!r} is not one node name or host list",
                    "give one entry per node, e.g. [gpu01, 'gpu[03-05]']",
                )
        lines.append(sbatch_line("exclude", ",".join(sl.exclude), field="cluster.slurm.exclude"))
    after = dependency(spec)
    if after:  # a dependency that can never be met (a failed job, when: ok) ends this job instead of pending forever
        lines.append(sbatch_line("dependency", after, field="cluster.slurm.depends_on"))
        lines.append(sbatch_line("kill-on-invalid-dep", "yes", field="cluster.slurm.depends_on"))
    out = log_pattern(opts.run_dir, array)
    lines += [
        sbatch_line("output", out, field="logging.dir"),
        sbatch_line("error", out, field="logging.dir"),
        sbatch_line("open-mode", "append", field="<internal>"),
        sbatch_line("requeue", field="<internal>"),
        sbatch_line("signal", f"B:USR1@{sl.signal_grace_s}", field="cluster.slurm.signal_grace_s"),
    ]
    if array:
        from launchers.slurm.arrays import array_spec

        lines.append(
            sbatch_line("array", array_spec(opts.n_tasks, spec.sweep.max_parallel), field="sweep.max_parallel")
        )
    return lines


# Variables the batch script itself sets or reads: a cluster.env / cluster.secrets entry of the same
# name would be exported over them (TASK=math broke the restart helper's --task).
SCRIPT_VARIABLES = frozenset(
    {
        "RUN_DIR",
        "TASK",
        "got",
        "step_pid",
        "rc",
        "value",
        "SLIME_HELPER",
        "SLIME_RUN_DIR",
        "SLIME_TASK",
        "SLIME_TASK_OFFSET",
    }
)


def _check_not_reserved(name: str, field: str) -> None:
    if name in SCRIPT_VARIABLES or name.startswith("SLURM_"):
        what = "set by SLURM for the job" if name.startswith("SLURM_") else "a variable of the batch script"
        raise _reject(
            field,
            f"{name!r} is {what}; exporting it would change how the job runs",
            "rename the variable (the job reads the run dir and task from SLIME_RUN_DIR / SLIME_TASK)",
        )


def _env_lines(spec: Spec) -> list[str]:
    c = spec.cluster
    for name in [*c.env, *c.secrets]:
        _check_not_reserved(name, f"cluster.{'env' if name in c.env else 'secrets'}.{name}")
    lines: list[str] = []
    if c.env:
        lines.append("# Plain environment (cluster.env).")
        lines += [export_line(k, v) for k, v in sorted(c.env.items())]
    if c.secrets:
        lines += ["", "# Secrets (cluster.secrets): exported from their reference inside the job.", _SECRET_FUNCS]
        for name, ref in sorted(c.secrets.items()):
            check_env_name(name, f"cluster.secrets.{name}")
            if (ref.env is None) == (ref.file is None):
                raise _reject(
                    f"cluster.secrets.{name}",
                    "a secret needs exactly one of {env: VAR} or {file: PATH}",
                    "secrets are references; never put the value in the spec",
                )
            if ref.env is not None:
                check_env_name(ref.env, f"cluster.secrets.{name}.env")
                lines.append(f"slime_secret_env {name} {ref.env}")
            else:
                lines.append(f"slime_secret_file {name} {q(ref.file)}")
    return lines


def render_script(spec: Spec, opts: ScriptOptions) -> str:
    """The batch script for ``spec`` (the base spec: ``cluster``/``logging`` are never swept)."""
    if opts.driver is not None and not DRIVER_PATTERN.fullmatch(opts.driver):
        raise ValueError(f"driver must be a python module name, got {opts.driver!r}")
    c = spec.cluster
    parts = [
        "#!/bin/bash",
        f"# slime-submit batch script for {spec.name!r}: {c.nodes} node(s)"
        + (f" x {c.gpus_per_node} GPU(s)" if c.gpus_per_node else ", CPU only")
        + (f", array of {opts.n_tasks} sweep task(s)" if spec.sweep is not None else "")
        + ".",
        "# Generated: every value below is quoted by launchers/quoting.py. Secrets appear only as",
        "# references. Each task reads its resolved spec from $RUN_DIR/tasks/$TASK/resolved.json.",
        *_header(spec, opts),
        "",
        "set -euo pipefail",
        "",
        f"RUN_DIR={q(opts.run_dir)}",
        "# Sweep task = array index + offset (MaxArraySize caps the index; split arrays pass an offset).",
        "TASK=$(( ${SLIME_TASK_OFFSET:-0} + ${SLURM_ARRAY_TASK_ID:-0} ))",
        'export SLIME_RUN_DIR="$RUN_DIR" SLIME_TASK="$TASK"',
        "",
        _SIGNALS,
        "",
        'echo "slime: job ${SLURM_JOB_ID:-?} task $TASK on ${SLURM_JOB_NODELIST:-?}'
        ' (restart ${SLURM_RESTART_COUNT:-0})"',
    ]
    env = _env_lines(spec)
    if env:
        parts += ["", *env]
    setup = setup_lines(spec)
    if setup:
        parts += ["", *setup]
    return "\n".join(parts + _steps(spec, opts)) + "\n"


def _steps(spec: Spec, opts: ScriptOptions) -> list[str]:
    """The restart helper and the one bootstrap step per node (after the site setup, in the container, if any)."""
    wrap = wrapping(spec)
    helper = [*wrap.before_python, q(opts.python)]
    if wrap.helper_needs_srun:  # the helper needs our Python, which lives in pyxis' container
        helper = ["srun", "--nodes=1", "--ntasks=1", *wrap.srun_flags, *helper]
    cmd = [
        "srun",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *wrap.srun_flags,
        *wrap.before_python,
        q(opts.python),
        "-m",
        "launchers.node.bootstrap",
        '"$RUN_DIR"',
        "--task",
        '"$TASK"',
    ]
    if opts.preflight_only:
        cmd.append("--preflight-only")
    if opts.driver:
        cmd += ["--driver", q(opts.driver)]
    return [
        "",
        "SLIME_HELPER=(" + " \\\n    ".join(_wrap(helper)) + ")",
        _RESTARTS,
        "",
        "# One bootstrap per node: Ray head on node 0, workers elsewhere; then preflight and driver.",
        " \\\n    ".join(_wrap(cmd)) + " &",
        _WAIT,
    ]


def _wrap(words: list[str], width: int = 88) -> list[str]:
    """Group words into lines of about ``width`` characters (joined with ``\\`` continuations)."""
    lines: list[str] = []
    cur = ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines
