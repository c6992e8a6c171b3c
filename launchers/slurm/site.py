"""The site parts of the batch script: the container each node's work runs in, and the setup before it.

pyxis is srun flags (``--container-image``, ``--container-mounts``, ``--container-workdir``);
Apptainer/Singularity is a command run by srun on every node (``apptainer exec --nv --bind SRC:DST[:ro]
... --pwd WORKDIR IMAGE``) with the same mounts and workdir; both add the run's logging dir. The setup
(``cluster.slurm.setup``) is a shell function in the batch script, exported, and run by ``bash -c``
before every command of ours on every node (inside the container with pyxis, before it otherwise).
Values are quoted by ``launchers.quoting``; setup lines are shell by design, checked single-line only.
"""

from __future__ import annotations

from launchers.quoting import q
from slime.spec import Problem, SpecError
from slime.spec.types import Spec

__all__ = ["Wrapping", "setup_lines", "wrapping"]

SETUP_FUNCTION = "slime_site_setup"
# bash -c's $0 names the process in ps/errors; "$@" is our command, run once the setup succeeded.
_RUN_SETUP = ["bash", "-c", q(f'set -e; {SETUP_FUNCTION}; exec "$@"'), "slime-site-setup"]
_MODULE_INIT = (
    "type module >/dev/null 2>&1 || for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh "
    '/usr/share/lmod/lmod/init/bash; do [[ -r $f ]] && source "$f" && break; done'
)


def _reject(field: str, message: str, hint: str) -> SpecError:
    return SpecError([Problem(path=field, message=message, hint=hint)])


def check_single_line(value: str, field: str) -> str:
    """``value`` if it holds no newline, CR or NUL (each would end this value's line of the script)."""
    if any(ch in value for ch in "\n\r\0"):
        raise _reject(
            field, f"{value!r} holds a line break or NUL, which would split it over script lines", "write one line"
        )
    return value


def _mounts(spec: Spec) -> list[str]:
    """The container's mounts, with the logging dir (the run dir must be visible inside)."""
    ct = spec.cluster.slurm.container
    mounts = list(ct.mounts)
    for i, m in enumerate(mounts):
        check_single_line(m, f"cluster.slurm.container.mounts[{i}]")
        if "," in m:
            raise _reject(
                f"cluster.slurm.container.mounts[{i}]",
                f"{m!r} contains a comma, which {ct.runtime} reads as a separator between mounts",
                "give one mount per entry",
            )
    logdir = spec.logging.dir
    if not any(m.split(":")[0] == logdir for m in mounts):
        if "," in logdir or ":" in logdir:
            raise _reject(
                "logging.dir",
                f"{logdir!r} contains ',' or ':' and cannot be mounted into the container",
                "use a logging.dir without commas or colons",
            )
        mounts.append(f"{logdir}:{logdir}")
    return mounts


class Wrapping:
    """How our commands run on a node: extra srun flags, and words before the Python interpreter."""

    def __init__(self, srun_flags: list[str], before_python: list[str], helper_needs_srun: bool) -> None:
        self.srun_flags, self.before_python, self.helper_needs_srun = srun_flags, before_python, helper_needs_srun


def wrapping(spec: Spec) -> Wrapping:
    """The container and setup of ``spec`` as srun flags and a command prefix (see the module doc)."""
    sl = spec.cluster.slurm
    setup = _RUN_SETUP if setup_lines(spec) else []
    ct = sl.container
    if ct is None:
        return Wrapping([], setup, False)
    mounts = _mounts(spec)
    if ct.runtime == "pyxis":
        flags = [f"--container-image={q(ct.image)}", f"--container-mounts={q(','.join(mounts))}"]
        if ct.workdir:
            flags.append(f"--container-workdir={q(ct.workdir)}")
        return Wrapping(flags, setup, True)  # the container is srun's: even the helper needs a step
    words = [ct.runtime, "exec"]
    if spec.cluster.gpus_per_node:
        words.append("--nv")
    for m in mounts:
        words += ["--bind", q(m)]
    if ct.workdir:
        words += ["--pwd", q(ct.workdir)]
    return Wrapping([], [*setup, *words, q(ct.image)], False)


def setup_lines(spec: Spec) -> list[str]:
    """The setup function's definition (empty without ``cluster.slurm.setup``)."""
    st = spec.cluster.slurm.setup
    if st is None or not (st.modules or st.venv or st.conda or st.lines):
        return []
    body = ["set +u  # module and conda scripts read unset variables"]
    if st.modules:
        body.append(_MODULE_INIT)
        for i, name in enumerate(st.modules):
            check_single_line(name, f"cluster.slurm.setup.modules[{i}]")
            body.append(f"module load {q(name)}")
    if st.venv:
        check_single_line(st.venv, "cluster.slurm.setup.venv")
        body.append(f"source {q(st.venv.rstrip('/') + '/bin/activate')}")
    if st.conda:
        check_single_line(st.conda, "cluster.slurm.setup.conda")
        body += ['eval "$(conda shell.bash hook)"', f"conda activate {q(st.conda)}"]
    for i, line in enumerate(st.lines):
        check_single_line(line, f"cluster.slurm.setup.lines[{i}]")  # shell on purpose: the site's own commands
        body.append(line)
    body.append("set -u")
    return [
        "# Site setup (cluster.slurm.setup): run on every node before our Python (bash -c below), inside",
        "# the container with pyxis and before it otherwise; a failing line stops that node's command.",
        f"{SETUP_FUNCTION}() {{",
        *("    " + b for b in body),
        "}",
        f"export -f {SETUP_FUNCTION}",
    ]
