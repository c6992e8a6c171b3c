"""Site parts of the batch script (``launchers.slurm.site``): GPU request styles, Apptainer, site setup.

The script is really executed by bash. Stand-ins at process boundaries that cannot run here, each a
small recording script on PATH: ``srun`` (no SLURM step in a unit test: it drops its own ``--`` flags
and runs the command, as the step would on a node), ``apptainer`` (not installable here: it records
its argv and execs the command after the image), ``module`` and ``conda`` (no Lmod/conda here: they
record what they were asked to load/activate), and ``python-fake`` for our node Python (records its
argv and environment). A canary file proves no hostile value was executed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from slime.spec import SpecError
from tests.fixtures.fake_slurm import FakeSlurm
from tests.fixtures.slurm_script import compile_script, spec_text

BASH = shutil.which("bash")

SRUN = '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n'
APPTAINER = r"""#!/bin/bash
printf "%s\0" "$@" > "$SHIM_REC/apptainer"
shift  # exec
while [[ $1 == --* ]]; do
    case $1 in --nv) shift ;; --pwd) cd "$2" 2>/dev/null; shift 2 ;; *) shift 2 ;; esac
done
shift  # the image
exec "$@"
"""
MODULE = '#!/bin/bash\nprintf "%s\\0" "$@" >> "$SHIM_REC/module"\n'
CONDA = r"""#!/bin/bash
if [[ $1 == shell.bash ]]; then echo 'conda() { printf "%s\0" "$@" >> "$SHIM_REC/conda"; }'; fi
"""
PYTHON = r"""#!/bin/bash
for a in "$@"; do [[ $a == launchers.slurm.restarts ]] && exit 0; done
printf "%s\0" "$@" > "$SHIM_REC/python"
env -0 > "$SHIM_REC/python-env"
"""


def sbatch_options(script: str) -> dict[str, str | None]:
    """The #SBATCH flags of a script whose values need no quoting (test_slurm_render.py reads quoted ones)."""
    lines = [ln[len("#SBATCH ") :] for ln in script.splitlines() if ln.startswith("#SBATCH ")]
    return {flag: value or None for flag, _, value in (ln.partition("=") for ln in lines)}


def _hostile(canary: str, tag: str) -> str:
    return f"{tag} a b'c\"d $(touch {canary}) ;touch {canary}; `touch {canary}` #x & | > < * ? \\ end"


def _nul(path: Path) -> list[str]:
    return [a.decode() for a in path.read_bytes().split(b"\0")[:-1]]


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.delenv("SLIME_CLUSTERS", raising=False)


def _run(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, FakeSlurm]:
    fake = FakeSlurm(tmp_path)
    for name, body in (("srun", SRUN), ("apptainer", APPTAINER), ("module", MODULE), ("conda", CONDA)):
        fake.add(name, body)
    fake.add("python-fake", PYTHON)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = fake.env(inherit=False, HOME=str(tmp_path), PATH=f"{fake.bin}:/usr/bin:/bin")
    proc = subprocess.run([BASH, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    return proc, fake


@pytest.mark.parametrize("via", ["spec", "profile"])
def test_hostile_values_through_every_site_field_reach_the_node_exactly_and_execute_nothing(tmp_path, monkeypatch, via):
    """The same values written in the spec, or in a cluster profile file (YAML-quoted) the spec selects."""
    canary = tmp_path / "CANARY"
    h = lambda tag: _hostile(canary.name, tag)  # noqa: E731
    mount = h("M").replace(",", ";").replace(":", ";")  # mount lists: no ',' or ':'
    venv = tmp_path / h("V").replace("/", "_")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text('export VENV_ACTIVE="${BASH_SOURCE[0]}"\n')
    workdir = tmp_path / "wd"
    workdir.mkdir()
    logdir = tmp_path / "logs"
    slurm = dict(
        account=h("A"),
        container={"runtime": "apptainer", "image": h("I"), "mounts": [mount], "workdir": str(workdir)},
        setup={
            "modules": [h("MOD1"), h("MOD2")],
            "venv": str(venv),
            "conda": h("CONDA"),
            "lines": ['export SITE_LINE="ran on $(hostname)"'],
        },
    )
    if via == "spec":
        text = spec_text(logdir=str(logdir), slurm=slurm)
    else:
        profiles = tmp_path / "clusters.yaml"
        profiles.write_text(json.dumps({"clusters": {"site": {"cluster": {"slurm": slurm}}}}))  # JSON is YAML
        monkeypatch.setenv("SLIME_CLUSTERS", str(profiles))
        text = spec_text(logdir=str(logdir), profile="site")
    script = compile_script(text, python="python-fake")
    assert f"#SBATCH --account={h('A')}" not in script  # quoted for sbatch's tokenizer, not pasted
    proc, fake = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not canary.exists(), "a hostile value was executed"
    run_dir = str(logdir / "run-1")
    assert _nul(fake.rec / "apptainer") == [
        "exec",
        "--nv",
        "--bind",
        mount,
        "--bind",
        f"{logdir}:{logdir}",
        "--pwd",
        str(workdir),
        h("I"),
        "python-fake",
        "-m",
        "launchers.node.bootstrap",
        run_dir,
        "--task",
        "0",
    ]
    # the setup runs before each command of ours: the restart helper, then the node's bootstrap
    assert _nul(fake.rec / "module") == ["load", h("MOD1"), "load", h("MOD2")] * 2
    assert _nul(fake.rec / "conda") == ["activate", h("CONDA")] * 2
    env = dict(e.split("=", 1) for e in _nul(fake.rec / "python-env"))
    assert env["VENV_ACTIVE"] == str(venv / "bin" / "activate") and env["SITE_LINE"].startswith("ran on ")


def test_a_failing_setup_line_stops_the_node_before_our_python(tmp_path):
    script = compile_script(
        spec_text(logdir=str(tmp_path), slurm={"setup": {"lines": ["false"]}}), python="python-fake"
    )
    proc, fake = _run(script, tmp_path)
    assert proc.returncode != 0 and not (fake.rec / "python").exists()


@pytest.mark.parametrize(
    "slurm, flag, value",
    [
        ({}, "--gpus-per-node", "2"),
        ({"gpu_request": "gres"}, "--gres", "gpu:2"),
        ({"gpu_request": "gres", "gpu_type": "a100"}, "--gres", "gpu:a100:2"),
        ({"gpu_request": "gpus-per-task"}, "--gpus-per-task", "2"),
        ({"gpu_request": "gpus-per-task", "gpu_type": "h100"}, "--gpus-per-task", "h100:2"),
    ],
)
def test_gpu_request_styles(slurm, flag, value):
    opts = sbatch_options(compile_script(spec_text(slurm=slurm)))
    assert opts[flag] == value
    assert not {"--gpus-per-node", "--gres", "--gpus-per-task"} - {flag} & set(opts)


def test_no_gpu_request_for_a_cpu_job():
    opts = sbatch_options(compile_script(spec_text(gpus_per_node=0, slurm={"gpu_request": "gres", "gpu_type": "a"})))
    assert not {"--gpus-per-node", "--gres", "--gpus-per-task"} & set(opts)


@pytest.mark.parametrize(
    "slurm, path",
    [
        ({"gpu_type": "a100:4"}, "cluster.slurm.gpu_type"),
        ({"gpu_type": "a $(x)"}, "cluster.slurm.gpu_type"),
        ({"gpu_request": "gpus"}, "cluster.slurm.gpu_request"),
        ({"container": {"image": "x.sif", "runtime": "docker"}}, "cluster.slurm.container.runtime"),
        ({"setup": {"lines": ["a\nb"]}}, "cluster.slurm.setup.lines[0]"),
        ({"setup": {"modules": ["cuda\n"]}}, "cluster.slurm.setup.modules[0]"),
        ({"setup": {"venv": "/v\r"}}, "cluster.slurm.setup.venv"),
        ({"container": {"image": "x.sif", "runtime": "apptainer", "mounts": ["/a:/b,/c:/d"]}}, None),
    ],
)
def test_bad_site_values_are_spec_errors_naming_the_field(slurm, path):
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(slurm=slurm))
    got = err.value.problems[0].path
    assert got == (path or "cluster.slurm.container.mounts[0]"), json.dumps(slurm)


def test_the_ci_cluster_types_its_fake_gpus_unless_asked_not_to():
    """ci/slurm-cluster.sh config: the GRES is typed 'fake' (for --gres=gpu:fake:N, as many sites type
    theirs), another SLIME_SLURM_GPU_TYPE names another type, and set empty it is untyped."""
    script = Path(__file__).resolve().parents[2] / "ci" / "slurm-cluster.sh"

    def config(**env) -> str:
        proc = subprocess.run(
            [BASH, str(script), "config"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    plain, typed = config(SLIME_SLURM_GPU_TYPE=""), config()
    assert " Gres=gpu:a100:2 " in config(SLIME_SLURM_GPU_TYPE="a100")
    assert " Gres=gpu:2 " in plain and "Name=gpu File=" in plain and "Name=gpu Type=" not in plain
    assert " Gres=gpu:fake:2 " in typed and "Name=gpu Type=fake File=" in typed
    bad = subprocess.run(
        [BASH, str(script), "config"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "SLIME_SLURM_GPU_TYPE": "a;b"},
    )
    assert bad.returncode != 0 and "SLIME_SLURM_GPU_TYPE" in bad.stderr


@pytest.mark.parametrize(
    "container, path",
    [
        ({"image": "/images/x.sif"}, "cluster.slurm.container.runtime"),
        ({"image": "nvcr.io#nvidia/pytorch:25.01-py3", "runtime": "apptainer"}, "cluster.slurm.container.image"),
    ],
)
def test_an_image_written_for_the_other_runtime_is_a_warning(container, path):
    from slime.spec import load_spec_text

    loaded = load_spec_text(spec_text(slurm={"container": container}))
    assert [w.path for w in loaded.warnings] == [path]
