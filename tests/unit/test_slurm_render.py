"""The rendered batch script: golden files, bash syntax, and hostile values that must stay inert.

Goldens live in tests/golden/slurm/*.sbatch; refresh them with ``UPDATE_GOLDEN=1 pytest ...``.
Hostile values (spaces, quotes, ``$(...)``, backticks, ``;``, ``#``, ``%``, backslashes,
newlines where bash can hold them) go into every free-text field that reaches the script; the
script is then really executed by bash with ``srun`` shimmed by a recording script on PATH (the
one fake: there is no SLURM step to launch here), and a canary file proves nothing was executed.
The ``#SBATCH`` lines are read back with a model of sbatch's own tokenizer (Slurm's
``_get_argument`` in src/sbatch/opt.c); tests/e2e/test_slurm_e2e.py checks the same against real
sbatch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launchers.slurm.script import ScriptOptions, render_script
from slime.spec import SpecError, load_spec_text
from tests.fixtures.fake_slurm import EXIT_0, RECORD_ARGS_AND_ENV, FakeSlurm
from tests.fixtures.slurm_script import compile_script, spec_text

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"
BASH = shutil.which("bash")


def sbatch_tokens(text: str) -> list[str]:
    """Words of one #SBATCH line body, as sbatch's tokenizer reads them (see module docstring)."""
    words, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return words
        arg, quoted, q, esc = [], False, "", False
        while i < len(text) and (quoted or not text[i].isspace()) and text[i] != "\n":
            ch = text[i]
            if esc:
                esc = False
            elif ch == "\\":
                esc, i = True, i + 1
                continue
            elif quoted:
                if ch == q:
                    quoted, i = False, i + 1
                    continue
            elif ch in "\"'":
                quoted, q, i = True, ch, i + 1
                continue
            elif ch == "#":
                i = len(text)
                break
            arg.append(ch)
            i += 1
        assert not quoted, f"unmatched quote in {text!r}"
        words.append("".join(arg))


def sbatch_options(script: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            (word,) = sbatch_tokens(line[len("#SBATCH") :])
            flag, sep, value = word.partition("=")
            out[flag] = value if sep else None
    return out


def bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sbatch"
    path.write_text(script)
    proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


CASES = {
    "basic": dict(
        cluster=dict(
            slurm=dict(partition="batch", mem="8G", time_limit="01:00:00"),
            cpus_per_node=8,
            env={"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "WARN"},
        )
    ),
    "sweep": dict(cluster=dict(nodes=1, sweep={"grid": {"train.seed": [1, 2, 3]}, "max_parallel": 2})),
    "cpu": dict(cluster=dict(nodes=1, gpus_per_node=0)),
    "everything": dict(
        cluster=dict(
            slurm=dict(
                partition="gpu",
                account="proj-42",
                qos="high",
                constraint="h100&ib",
                reservation="maint",
                exclude=["gpu07", "gpu[10-12]"],
                signal_grace_s=300,
                depends_on=[{"job": "4242"}, {"job": "4243_1", "when": "any"}, {"job": "4244", "when": "ok"}],
                container={
                    "image": "nvcr.io#nvidia/pytorch:25.01-py3",
                    "mounts": ["/data:/data:ro"],
                    "workdir": "/work",
                },
            ),
            env={"HF_HOME": "/cache/hf"},
            secrets={"WANDB_API_KEY": {"env": "MY_WANDB_KEY"}, "HF_TOKEN": {"file": "/home/u/.hf token"}},
        ),
        extra=dict(preflight_only=True, driver="tests.fixtures.tinydriver"),
    ),
    # Sites as they are, through cluster profiles (tests/fixtures/clusters.yaml): the spec names the profile only.
    "profile_gres_type_apptainer_modules": dict(cluster=dict(profile="a100-apptainer", gpus_per_node=4)),
    "profile_pyxis_venv": dict(cluster=dict(profile="h100-pyxis", gpus_per_node=4)),
    "profile_no_container_conda": dict(cluster=dict(profile="plain", gpus_per_node=2)),
}
CLUSTERS = Path(__file__).resolve().parents[1] / "fixtures" / "clusters.yaml"


@pytest.fixture(autouse=True)
def _profiles(monkeypatch, tmp_path):
    """The test profiles, and no user clusters file of this machine."""
    monkeypatch.setenv("SLIME_CLUSTERS", str(CLUSTERS))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_matches_golden_and_is_valid_bash(name, tmp_path):
    case = CASES[name]
    script = compile_script(spec_text(**dict(case["cluster"])), **dict(case.get("extra", {})))
    bash_n(script, tmp_path)
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(script)
    assert golden.exists(), f"missing golden {golden}; run with UPDATE_GOLDEN=1"
    assert script == golden.read_text(), f"{name} differs from {golden} (UPDATE_GOLDEN=1 refreshes it)"


def test_header_carries_every_resource_and_resilience_setting():
    script = compile_script(spec_text(**CASES["everything"]["cluster"]))
    opts = sbatch_options(script)
    assert opts["--job-name"] == "golden" and opts["--nodes"] == "2" and opts["--ntasks-per-node"] == "1"
    assert opts["--gpus-per-node"] == "2" and opts["--cpus-per-task"] == "2"  # one CPU per GPU slot by default
    assert opts["--partition"] == "gpu" and opts["--account"] == "proj-42" and opts["--qos"] == "high"
    assert opts["--constraint"] == "h100&ib" and opts["--reservation"] == "maint"
    assert opts["--exclude"] == "gpu07,gpu[10-12]"
    assert opts["--output"] == opts["--error"] == "/runs/run-1/logs/slurm-%j.out"
    assert "--requeue" in opts and opts["--open-mode"] == "append" and opts["--signal"] == "B:USR1@300"
    assert "--array" not in opts
    assert opts["--dependency"] == "afterok:4242:4244,afterany:4243_1" and opts["--kill-on-invalid-dep"] == "yes"
    assert "MY_WANDB_KEY" in script and "/home/u/.hf token" in script  # references only


def test_sweep_is_one_array_with_max_parallel_and_task_offset():
    script = compile_script(spec_text(**CASES["sweep"]["cluster"]))
    opts = sbatch_options(script)
    assert opts["--array"] == "0-2%2"
    assert opts["--output"] == "/runs/run-1/logs/slurm-%A_%a.out"
    assert "TASK=$(( ${SLIME_TASK_OFFSET:-0} + ${SLURM_ARRAY_TASK_ID:-0} ))" in script


# --------------------------------------------------------------------------- hostile values
def _hostile(canary: str, tag: str) -> str:
    """``canary`` is a bare file name: bash would create it in the script's cwd (the test's tmp dir)."""
    return f"{tag} a b'c\"d $(touch {canary}) ;touch {canary}; `touch {canary}` #x %j & | > < * ? \\ end"


def _run_script(script: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    fake = FakeSlurm(tmp_path)
    fake.add("srun", RECORD_ARGS_AND_ENV)
    # the restarts helper (python -m launchers.slurm.restarts) is tested in test_slurm_restarts.py
    helper = fake.add("helper", EXIT_0)
    path = tmp_path / "job.sbatch"
    path.write_text(script.replace("SLIME_HELPER=(/opt/venv/bin/python)", f"SLIME_HELPER=({helper})"))
    full = fake.env(inherit=False, HOME=str(tmp_path), **env)
    return subprocess.run([BASH, str(path)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"job": "1 $(touch CANARY)"}, "cluster.slurm.depends_on[0].job"),
        ({"job": "1:2"}, "cluster.slurm.depends_on[0].job"),  # two jobs in one entry: one entry each
        ({"job": "1,afterany:2"}, "cluster.slurm.depends_on[0].job"),
        ({"job": "12\n#SBATCH --wrap=x"}, "cluster.slurm.depends_on[0].job"),
        ({"job": "12", "when": "ok;touch CANARY"}, "cluster.slurm.depends_on[0].when"),
        ({"job": "12", "after": "x"}, "cluster.slurm.depends_on[0].after"),
    ],
)
def test_hostile_depends_on_is_refused_naming_the_entry(entry, field):
    """Only a job id reaches --dependency: anything else is refused at load, naming the entry."""
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(slurm={"depends_on": [entry]}))
    assert [p.path for p in err.value.problems] == [field]


def test_hostile_values_reach_the_job_exactly_and_execute_nothing(tmp_path):
    canary = tmp_path / "CANARY"
    h = lambda tag: _hostile(canary.name, tag)  # noqa: E731
    one_line = lambda tag: h(tag).replace(",", ";").replace(":", ";")  # noqa: E731 (pyxis lists: no , or :)
    logdir = tmp_path / f"logs dir 'q' \"dq\" $(touch {canary.name}) ;x `touch {canary.name}` %p & #"
    secret_file = tmp_path / f"secret 'file' $(touch {canary.name}).txt"
    secret_file.write_text(f"  {h('S2')}  \nsecond line\n")
    text = spec_text(
        slurm=dict(
            partition=h("P"),
            account=h("A"),
            qos=h("Q"),
            constraint=h("C"),
            reservation=h("R"),
            exclude=[one_line("X")],
            container={"image": h("I"), "mounts": [one_line("M") + ";/dst"], "workdir": h("W") + "\nx"},
        ),
        logdir=str(logdir),
        env={"PLAIN": h("E") + "\nsecond line\n", "EMPTY": ""},
        secrets={"S1": {"env": "SRC_VAR"}, "S2": {"file": str(secret_file)}},
    )
    script = compile_script(text)
    bash_n(script, tmp_path)

    opts = sbatch_options(script)
    for flag, tag in (
        ("--partition", "P"),
        ("--account", "A"),
        ("--qos", "Q"),
        ("--constraint", "C"),
        ("--reservation", "R"),
    ):
        assert opts[flag] == h(tag), flag
    assert opts["--exclude"] == one_line("X")
    assert opts["--output"] == str(logdir).replace("%", "%%") + "/run-1/logs/slurm-%j.out"

    proc = _run_script(script, tmp_path, {"SRC_VAR": h("S1")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not canary.exists(), "a hostile value was executed"
    args, env = FakeSlurm(tmp_path).recorded()
    run_dir = str(logdir / "run-1")
    assert f"--container-image={h('I')}" in args
    assert f"--container-mounts={one_line('M')};/dst,{logdir}:{logdir}" in args
    assert f"--container-workdir={h('W')}\nx" in args
    assert args[args.index("launchers.node.bootstrap") + 1 :] == [run_dir, "--task", "0"]
    assert env["PLAIN"] == h("E") + "\nsecond line\n" and env["EMPTY"] == ""
    assert env["S1"] == h("S1") and env["S2"] == h("S2")
    assert env["SLIME_RUN_DIR"] == run_dir and env["SLIME_TASK"] == "0"
    # The secret values never appear in the script, only their references.
    assert h("S1") not in script and h("S2") not in script


def test_a_missing_secret_source_stops_the_job_before_srun(tmp_path):
    script = compile_script(spec_text(secrets={"TOKEN": {"env": "NOT_SET_ANYWHERE"}}))
    proc = _run_script(script, tmp_path, {})
    assert proc.returncode == 3
    assert "secret TOKEN: environment variable NOT_SET_ANYWHERE is not set" in proc.stderr
    assert not (tmp_path / "rec" / "args").exists()


def test_array_task_and_offset_select_the_task(tmp_path):
    script = compile_script(spec_text(nodes=1, sweep={"grid": {"train.seed": [1, 2, 3]}}))
    proc = _run_script(script, tmp_path, {"SLURM_ARRAY_TASK_ID": "1", "SLIME_TASK_OFFSET": "1000"})
    assert proc.returncode == 0, proc.stderr
    args, env = FakeSlurm(tmp_path).recorded()
    assert args[-2:] == ["--task", "1001"] and env["SLIME_TASK"] == "1001"


def test_the_script_never_signals_the_step_and_returns_its_code(tmp_path):
    """USR1/TERM to the batch shell become a stop file (see test_slurm_restarts.py): srun itself gets no
    signal (slurmstepd would pass it to every process of the step); the script returns the step's code."""
    fake = FakeSlurm(tmp_path)
    rec = fake.rec
    fake.add(
        "srun",
        "#!/bin/bash\ntrap 'echo USR1 >> \"$SHIM_REC/sig\"' USR1\n"
        "trap 'echo TERM >> \"$SHIM_REC/sig\"' TERM\n"
        'echo ready > "$SHIM_REC/ready"\nwhile [ ! -e "$SHIM_REC/go" ]; do sleep 0.05; done\n'
        "exit 42\n",
    )
    fake.add("python3", EXIT_0)  # the restarts helper: tested in test_slurm_restarts.py
    path = tmp_path / "job.sbatch"
    path.write_text(compile_script(spec_text(logdir=str(tmp_path)), python="python3"))
    env = fake.env(inherit=False, HOME=str(tmp_path), SLURM_JOB_ID="9")
    proc = subprocess.Popen([BASH, str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while not (rec / "ready").exists() and time.monotonic() < end:
        time.sleep(0.02)
    stop = tmp_path / "run-1" / "tasks" / "0" / "rendezvous" / "stop-9.0"
    end = time.monotonic() + 10
    while not stop.exists() and time.monotonic() < end:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.1)
    proc.terminate()
    time.sleep(0.3)
    assert stop.exists() and proc.poll() is None  # TERM after the step started: noted, the step goes on
    (rec / "go").touch()
    assert proc.wait(timeout=10) == 42
    assert not (rec / "sig").exists()


def test_term_before_the_step_ends_the_job_with_143(tmp_path):
    fake = FakeSlurm(tmp_path)
    fake.add("srun", RECORD_ARGS_AND_ENV)
    fake.add("python3", "#!/bin/sh\nkill -TERM $PPID\nsleep 1\n")  # TERM arrives during the start helper
    path = tmp_path / "job.sbatch"
    path.write_text(compile_script(spec_text(logdir=str(tmp_path)), python="python3"))
    proc = subprocess.run(
        [BASH, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        env=fake.env(inherit=False, HOME=str(tmp_path)),
    )
    assert proc.returncode == 143 and "finished with exit code 143" in proc.stdout
    assert not (fake.rec / "args").exists()  # srun never ran


@pytest.mark.parametrize(
    "field,value",
    [
        ("partition", "batch\nevil"),
        ("account", "a\rb"),
        ("qos", "q\nx"),
        ("constraint", "c\n"),
        ("reservation", "r\n1"),
        ("exclude", ["n1\nn2"]),
        ("logdir", "/runs/a\nb"),
    ],
)
def test_a_line_break_in_an_sbatch_value_is_a_spec_error_naming_the_field(field, value):
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(**({field: value} if field == "logdir" else {"slurm": {field: value}})))
    (problem,) = err.value.problems
    assert problem.path == ("logging.dir" if field == "logdir" else f"cluster.slurm.{field}")
    assert "line break" in problem.message


@pytest.mark.parametrize(
    "cluster, field",
    [
        ({"env": {"TASK": "math"}}, "cluster.env.TASK"),
        ({"env": {"RUN_DIR": "/data/x"}}, "cluster.env.RUN_DIR"),
        ({"env": {"SLURM_JOB_ID": "1"}}, "cluster.env.SLURM_JOB_ID"),
        ({"secrets": {"SLIME_TASK": {"env": "X"}}}, "cluster.secrets.SLIME_TASK"),
    ],
)
def test_env_names_the_batch_script_uses_are_refused(cluster, field):
    """cluster.env TASK=math was exported over the script's task index: the restart helper got --task math."""
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(**cluster))
    (problem,) = err.value.problems
    assert problem.path == field and "rename the variable" in problem.hint


def test_backslash_in_logging_dir_and_comma_in_mounts_are_rejected():
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(logdir="/runs/a\\b"))
    assert err.value.problems[0].path == "logging.dir" and "backslash" in err.value.problems[0].message
    with pytest.raises(SpecError) as err:
        compile_script(spec_text(slurm={"container": {"image": "img", "mounts": ["/a:/b,/c:/d"]}}))
    assert err.value.problems[0].path == "cluster.slurm.container.mounts[0]"


def test_render_without_a_sweep_or_gpus_and_driver_validation(tmp_path):
    loaded = load_spec_text(spec_text(nodes=1, gpus_per_node=0), base_dir=Path("/specs"))
    with pytest.raises(ValueError):
        render_script(loaded.spec, ScriptOptions(run_dir=Path("/r"), driver="x; rm -rf /"))
    script = render_script(loaded.spec, ScriptOptions(run_dir=Path("/r"), driver="my_pkg.driver"))
    assert "--gpus-per-node" not in script and "--driver my_pkg.driver" in script
    bash_n(script, tmp_path)


# --------------------------------------------------------------------------- the quoting helper itself
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from launchers.quoting import export_line, q, sbatch_line, sbatch_word  # noqa: E402

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=40)


@given(_TEXT.filter(lambda t: "\n" not in t and "\r" not in t))
def test_sbatch_words_read_back_exactly(text):
    assert sbatch_tokens(sbatch_word(text, field="f")) == [text]


@settings(max_examples=30, deadline=None)
@given(_TEXT)
def test_bash_reads_quoted_values_back_exactly(text):
    out = subprocess.run(
        [BASH, "-c", f'{export_line("V", text)}; printf %s "$V"; printf %s {q(text)}'], capture_output=True, timeout=10
    )
    assert out.stdout.decode() == text + text


def test_quoting_helpers_validate_names_and_flags():
    assert sbatch_line("requeue", field="x") == "#SBATCH --requeue"
    assert sbatch_line("partition", "a b", field="x") == '#SBATCH --partition="a b"'
    with pytest.raises(SpecError) as err:
        export_line("1BAD", "v")
    assert err.value.problems[0].path == "cluster.env.1BAD"
    with pytest.raises(ValueError):
        sbatch_line("Bad Flag", "v", field="x")
