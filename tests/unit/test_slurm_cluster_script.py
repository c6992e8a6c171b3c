"""ci/slurm-cluster.sh's settings for a second cluster next to the default one, without starting either.

The script is sourced in bash (it then defines its functions only) and its renderers are run:
the default settings must render exactly what they always did (a running default cluster is then
not rebuilt), a second cluster must share no name, address, port or file with it, and ``up`` of a
second cluster refuses the default cluster's names before it changes anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "slurm-cluster.sh"
SECOND = {
    "SLIME_SLURM_NAME": "bench",
    "SLIME_SLURM_NODES": "8",
    "SLIME_SLURM_NODE_PREFIX": "bn",
    "SLIME_SLURM_SUBNET": "10.78.0",
    "SLIME_SLURM_CTLD_PORT": "6917",
    "SLIME_SLURM_FIRST_JOB_ID": "7000000",
}


def bash(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLIME_SLURM_", "SLURM_"))}
    return subprocess.run(
        ["bash", "-c", f"source {SCRIPT}\n{code}"],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def rendered(env: dict[str, str] | None = None) -> dict[str, str]:
    out = bash(
        'validate_env; printf "%s\\n" "$(render_slurm_conf)" "---" "$(render_gres_conf)" "---" "$(cluster_env)" '
        '"---" "$HOSTS_BEGIN" "$LOCK_FILE" "$BRIDGE" "$STATE" "$CONF_DIR" "${SLURM_CONF:-}"',
        env,
    )
    assert out.returncode == 0, out.stderr
    conf, gres, cluster_env, names = out.stdout.split("---\n")
    return {"conf": conf, "gres": gres, "env": cluster_env, "names": names}


def test_the_default_cluster_renders_what_it_always_did():
    r = rendered()
    assert "SlurmctldPort" not in r["conf"] and "FirstJobId" not in r["conf"] and "ClusterName=slime\n" in r["conf"]
    assert "NodeName=sn2 NodeAddr=10.77.0.12 NodeHostname=sn2" in r["conf"]
    assert [line.split("=")[0] for line in r["env"].split()] == [
        *("NODES", "NET", "CPUS", "GPUS", "MEM", "MAX_ARRAY", "GPU_TYPE")
    ]
    assert "NodeName=sn1 Name=gpu Type=fake File=" in r["gres"] and " Gres=gpu:fake:2" in r["conf"]  # typed, as sites


def test_untyped_gpus_when_the_type_is_set_empty():
    r = rendered({"SLIME_SLURM_GPU_TYPE": ""})
    assert "Type=" not in r["gres"] and " Gres=gpu:2" in r["conf"] and "GPU_TYPE" not in r["env"]
    assert r["names"].split("\n")[1:6] == [
        "/run/lock/slime-slurm.lock",
        "slimebr0",
        "/var/lib/slime-slurm",
        "/etc/slurm",
        "",  # no SLURM_CONF: clients read /etc/slurm
    ]


def test_a_second_cluster_shares_no_name_address_port_or_file_with_the_default_one():
    r = rendered(SECOND)
    assert "ClusterName=bench\n" in r["conf"] and "SlurmctldPort=6917\nFirstJobId=7000000\n" in r["conf"]
    assert "SlurmctldHost=" in r["conf"] and "(10.78.0.1)" in r["conf"]
    nodes = [line.split()[0] for line in r["conf"].splitlines() if line.startswith("NodeName=")]
    assert nodes == [f"NodeName=bn{i}" for i in range(1, 9)]
    assert "PartitionName=batch Nodes=bn[1-8]" in r["conf"] and "/var/lib/slime-slurm-bench/" in r["conf"]
    assert "File=/var/lib/slime-slurm-bench/dev/bn8-gpu[0-1]" in r["gres"]
    begin, lock, bridge, state, conf_dir, slurm_conf = r["names"].split("\n")[:6]
    assert "slime-slurm-bench" in begin and lock == "/run/lock/slime-slurm-bench.lock"
    assert (bridge, state, conf_dir, slurm_conf) == (
        "sb-bench",
        "/var/lib/slime-slurm-bench",
        "/etc/slurm-bench",
        "/etc/slurm-bench/slurm.conf",
    )
    assert "NAME=bench\nPREFIX=bn\nBRIDGE=sb-bench\nCONF_DIR=/etc/slurm-bench\n" in r["env"]


def test_down_of_a_second_cluster_acts_on_its_recorded_names_whatever_the_callers(tmp_path):
    r = rendered({**SECOND, "SLIME_SLURM_STATE_DIR": str(tmp_path)})
    (tmp_path / "cluster.env").write_text(r["env"])
    out = bash(
        'load_recorded_env; echo "$PREFIX $BRIDGE $NET $CTLD_PORT $LOCK_FILE $SLURM_CONF"',
        {"SLIME_SLURM_STATE_DIR": str(tmp_path)},  # the caller forgot the other settings
    )
    assert out.stdout.split() == [
        "bn",
        "sb-bench",
        "10.78.0",
        "6917",
        "/run/lock/slime-slurm-bench.lock",
        "/etc/slurm-bench/slurm.conf",
    ]


def test_a_second_cluster_with_the_default_ones_names_is_refused_before_anything_changes():
    env = {"SLIME_SLURM_NAME": "bench", "SLIME_SLURM_STATE_DIR": "/nonexistent/state"}
    out = bash("validate_env", env)
    assert out.returncode == 1
    assert "needs its own SLIME_SLURM_NODE_PREFIX, _SUBNET, _CTLD_PORT" in out.stderr
    assert not Path("/nonexistent/state").exists()
