"""The SLURM launcher's plug-in profile: its spec section ``cluster.slurm`` and where its parts live.

Imported when the spec types are composed: it imports only the spec's sections and plug-in API.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from slime.spec.plugin import Profile, V1Move
from slime.spec.sections import MEM_PATTERN, TIME_PATTERN, D, Section


class Container(Section, kw_only=True):
    """A container image to run each node's work in (pyxis/enroot, or Apptainer/Singularity)."""

    image: Annotated[
        str,
        D(
            "Container image: pyxis 'nvcr.io#nvidia/pytorch:25.01-py3' or a .sqsh path; apptainer a .sif path.",
            min_length=1,
        ),
    ]
    runtime: Annotated[
        Literal["pyxis", "apptainer", "singularity"],
        D("How the image runs: srun's pyxis flags, or `apptainer|singularity exec --nv --bind ... IMAGE` per node."),
    ] = "pyxis"
    mounts: Annotated[tuple[str, ...], D("Bind mounts 'SRC:DST[:ro]'.")] = ()
    workdir: Annotated[str | None, D("Working directory inside the container.")] = None


class Setup(Section, kw_only=True):
    """Site setup run on every node before the bootstrap (inside the container with pyxis, before it otherwise)."""

    modules: Annotated[tuple[str, ...], D("Environment modules to load, in order (`module load NAME`).")] = ()
    venv: Annotated[
        Annotated[str, Meta(min_length=1)] | None, D("A virtualenv directory to activate (`source VENV/bin/activate`).")
    ] = None
    conda: Annotated[
        Annotated[str, Meta(min_length=1)] | None, D("A conda environment (name or path) to activate.")
    ] = None
    lines: Annotated[
        tuple[str, ...], D("Free-form shell lines run after the modules and activation (one command per line).")
    ] = ()


class Dependency(Section, kw_only=True):
    """A job this one waits for: SLURM's ``--dependency=afterok:JOB`` (when: ok) or ``afterany:JOB`` (when: any)."""

    job: Annotated[
        str,
        D(
            "SLURM job id of the run to wait for (`slime-submit status RUN` shows it); '123_4' is one array task.",
            pattern=r"^[0-9]+(_[0-9]+)?$",
        ),
    ]
    when: Annotated[
        Literal["ok", "any"], D("Start after that job succeeded (ok), or after it ended in any way (any).")
    ] = "ok"


class SlurmOptions(Section, kw_only=True):
    """What sbatch is asked for, and how the job restarts."""

    partition: Annotated[str | None, D("SLURM partition.")] = None
    account: Annotated[str | None, D("SLURM account to charge.")] = None
    qos: Annotated[str | None, D("SLURM quality of service.")] = None
    constraint: Annotated[str | None, D("SLURM node feature constraint (e.g. 'h100&ib').")] = None
    exclude: Annotated[tuple[str, ...], D("Nodes SLURM must not allocate.")] = ()
    reservation: Annotated[str | None, D("SLURM reservation name.")] = None
    mem: Annotated[
        Annotated[str, Meta(pattern=MEM_PATTERN)] | None,
        D("Memory per node, SLURM style: '64G', '500M', or MB as a number."),
    ] = None
    time_limit: Annotated[
        Annotated[str, Meta(pattern=TIME_PATTERN)] | None,
        D("Wall-clock limit, SLURM style: 'MM', 'HH:MM:SS' or 'D-HH:MM:SS'."),
    ] = None
    gpu_request: Annotated[
        Literal["gpus-per-node", "gres", "gpus-per-task"],
        D("How GPUs are asked for: --gpus-per-node=N, --gres=gpu:N, or --gpus-per-task=N (one task per node)."),
    ] = "gpus-per-node"
    gpu_type: Annotated[
        Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]+$")] | None,
        D("The site's GRES type name (e.g. 'a100'): the request becomes TYPE:N in whichever style."),
    ] = None
    container: Annotated[
        Container | None, D("Run inside this container image (pyxis/enroot, or apptainer/singularity).")
    ] = None
    setup: Annotated[
        Setup | None, D("Module loads, a venv/conda activation and setup lines run on every node first.")
    ] = None
    depends_on: Annotated[
        tuple[Dependency, ...],
        D("Start only after these jobs (all of them): sbatch --dependency, checked against SLURM at submit."),
    ] = ()
    on_preflight_failure: Annotated[
        Literal["fail", "requeue_excluding"], D("On a failed preflight: fail, or requeue excluding the bad node.")
    ] = "fail"
    max_requeues: Annotated[int, D("Restarts allowed for preemptions and time-outs.", ge=0)] = 5
    max_failures: Annotated[int, D("Restarts allowed after failures (crashes, node loss).", ge=0)] = 0
    max_stalls: Annotated[
        int, D("Restarts allowed after a stall (no progress within cluster.stall_timeout_s: exit 124).", ge=0)
    ] = 1
    signal_grace_s: Annotated[
        int, D("Seconds before the time limit at which the job is warned (USR1) to checkpoint.", ge=10)
    ] = 120


_V1 = [
    "partition",
    "account",
    "qos",
    "constraint",
    "exclude",
    "reservation",
    "mem",
    "time_limit",
    "container",
    "on_preflight_failure",
    "max_requeues",
    "max_failures",
    "signal_grace_s",
]

PROFILE = Profile(
    summary="submits with sbatch to a SLURM cluster, one Ray cluster per job",
    implementation="launchers.slurm.launcher:SlurmLauncher",
    options=SlurmOptions,
    options_doc="SLURM settings: partition, account, limits, GPUs, container, setup, restarts (launcher: slurm).",
    pool_option="partition",
    hooks="launchers.slurm.hooks",
    node_env="launchers.slurm.env:slurm_node",
    v1_moves=tuple(V1Move(old=f"cluster.{n}", new=n) for n in _V1),
)
