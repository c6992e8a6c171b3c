"""Exact SGLang / sglang-router commands (golden files) and the megatron arguments of the example spec.

Refresh the golden files with ``UPDATE_GOLDEN=1 pytest tests/unit/test_sglang_launch.py``
and review the diff: each one is what a real cluster would execute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from slime.backends.megatron.config import MegatronConfigError
from slime.backends.megatron.render import render_megatron_args
from slime.backends.sglang.launch import (
    LaunchError,
    engine_commands,
    flags_from_args,
    port_blocks,
    render_engine_commands,
    router_command,
)
from slime.spec import SpecError
from slime.spec.load import load_spec
from tests.fixtures.hf_configs import QWEN25_7B

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SPEC = ROOT / "specs" / "grpo-multinode.yaml"


def _spec(*overrides: str, path: Path = SPEC):
    return load_spec(path, overrides=list(overrides)).tasks[0].spec


def _with_sglang(spec=None, **sglang):
    """``spec`` (the example spec) with ``rollout.sglang`` fields set after validation (validate would refuse them)."""
    base = _spec() if spec is None else spec
    return replace(base, rollout=replace(base.rollout, sglang=replace(base.rollout.sglang, **sglang)))


def _with_sglang_args(args: dict, spec=None):
    """The example spec with ``rollout.sglang.args`` set after validation (validate would refuse it)."""
    return _with_sglang(spec, args=args)


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} differs from the golden file (UPDATE_GOLDEN=1 to refresh)"


def test_grpo_multinode_engine_commands_golden():
    _golden("sglang_grpo_multinode.txt", render_engine_commands(_spec()))


def test_multinode_engine_golden():
    _golden("sglang_multinode_engine.txt", render_engine_commands(_spec("rollout.gpus_per_engine=16")))


def test_grpo_multinode_megatron_args_golden():
    _golden("sglang_grpo_multinode_megatron.txt", render_megatron_args(_spec(), QWEN25_7B))


def test_megatron_args_without_a_readable_config_keep_every_other_field():
    text = render_megatron_args(_spec())
    assert "num_layers=<from config.json at launch>" in text and "vocab_size=<from config.json at launch>" in text
    assert "tensor_model_parallel_size=2" in text and "recompute_granularity='full'" in text
    assert "use_distributed_optimizer=True" in text


def test_megatron_args_reject_a_layout_the_model_cannot_take():
    with pytest.raises(MegatronConfigError, match="tensor=8 does not divide the model's 28 attention heads and 4 key"):
        render_megatron_args(_spec("train.parallel.tensor=8"), QWEN25_7B)


def test_engine_command_structure():
    spec = _spec()
    cmds = engine_commands(spec, hosts=["10.0.0.1", "10.0.0.2"])
    assert len(cmds) == 8 and {c.nnodes for c in cmds} == {1}
    assert [(c.node, c.gpus, c.port) for c in cmds[3:5]] == [(0, (6, 7), 30040), (1, (0, 1), 30010)]
    c = cmds[5]
    argv = list(c.argv)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--base-gpu-id") + 1] == "2"
    assert argv[argv.index("--host") + 1] == "10.0.0.2" and c.url == "http://10.0.0.2:30020"
    assert c.ports == (30020, 30021)
    assert "--enable-memory-saver" in argv  # colocated
    assert argv[-4:] == ["--mem-fraction-static", "0.7", "--cuda-graph-max-bs-decode", "256"]
    multi = engine_commands(_spec("rollout.gpus_per_engine=16"), hosts=["a", "b"])
    assert [(c.node_rank, c.port, c.url) for c in multi] == [(0, 30010, "http://a:30010"), (1, None, None)]
    for c in multi:
        argv = list(c.argv)
        assert argv[argv.index("--dist-init-addr") + 1] == "a:30012" and argv[argv.index("--nnodes") + 1] == "2"


def test_disaggregated_engines_start_after_the_actor_gpus():
    spec = _spec(path=ROOT / "specs" / "grpo-disaggregated.yaml")
    cmds = engine_commands(spec)
    assert [c.gpus for c in cmds] == [(4, 5), (6, 7)]
    assert all("--enable-memory-saver" not in c.argv for c in cmds)


def test_sglang_args_conversion():
    flags = flags_from_args(
        {
            "mem-fraction-static": 0.8,
            "enable-torch-compile": True,
            "disable-radix-cache": False,
            "chunked-prefill-size": None,
            "attention-backend": "fa3",
            "max-running-requests": 128,
        },
        field_name="rollout.sglang.args",
    )
    assert flags == [
        "--mem-fraction-static",
        "0.8",
        "--enable-torch-compile",
        "--attention-backend",
        "fa3",
        "--max-running-requests",
        "128",
    ]
    for key in ("tp-size", "tp_size", "--port", "base_gpu_id", "dist-init-addr"):
        with pytest.raises(LaunchError, match=f"rollout.sglang.args.{key}: slime sets"):
            flags_from_args(
                {key: 1},
                field_name="rollout.sglang.args",
                reserved=("tp-size", "port", "base-gpu-id", "dist-init-addr"),
            )
    with pytest.raises(LaunchError, match="must be a string, number"):
        flags_from_args({"x": [1, 2]}, field_name="rollout.sglang.args")


def test_pp_size_divides_gpus_per_engine_and_reserved_keys_are_rejected_from_specs():
    spec = _spec("rollout.sglang.args.pp-size=2")
    argv = list(engine_commands(spec)[0].argv)
    assert argv[argv.index("--tp-size") + 1] == "1" and argv[argv.index("--pp-size") + 1] == "2"
    with pytest.raises(SpecError, match="pipeline-parallel size must be a positive integer dividing"):
        _spec("rollout.sglang.args.pp-size=3")  # validate refuses it first (the sglang_pipeline rule)
    with pytest.raises(LaunchError, match="pp-size=3 must be a positive integer dividing"):
        engine_commands(_with_sglang_args({"pp-size": 3}))
    with pytest.raises(LaunchError, match="rollout.sglang.args.tp-size: slime sets --tp-size itself"):
        engine_commands(_with_sglang_args({"tp-size": 4}))


@pytest.mark.parametrize(
    "key, flag",
    [
        ("base-gpu", "base-gpu-id"),
        ("nccl-po", "nccl-port"),
        ("dp-size", "dp-size"),
        ("data_parallel_size", "data-parallel-size"),
        ("gpu-id-step", "gpu-id-step"),
        ("attn-dp-size", "attn-dp-size"),
        ("dist", "dist-init-addr"),
    ],
)
def test_sglang_args_cannot_reach_placement_flags_even_abbreviated(key, flag):
    # argparse (allow_abbrev) would expand e.g. --base-gpu to --base-gpu-id, overriding slime's value
    with pytest.raises(LaunchError, match=rf"rollout\.sglang\.args\.{key}: slime sets --{flag} itself"):
        engine_commands(_with_sglang_args({key: 2}))  # a spec that skipped validate
    with pytest.raises(SpecError, match=rf"rollout\.sglang\.args\.{key}: slime-submit sets --{flag} itself"):
        _spec(f"rollout.sglang.args.{key}=2")  # validate refuses it first (the same table)


def test_sglang_args_keys_with_equals_are_rejected():
    with pytest.raises(LaunchError, match=r"rollout\.sglang\.args\.port=1: a key must not contain '='"):
        flags_from_args({"port=1": True}, field_name="rollout.sglang.args")


def test_engine_port_blocks_are_per_job_and_outside_the_ray_range(monkeypatch):
    from slime.core.ports import BLOCK, port_range

    monkeypatch.delenv("SLIME_ENGINE_PORT_RANGE", raising=False)
    monkeypatch.delenv("SLIME_RAY_PORT_RANGE", raising=False)
    ray_low, ray_high = port_range()
    firsts = {next(port_blocks(f"/runs/r{i}/tasks/0/logs/engines")) for i in range(20)}
    assert len(firsts) > 10  # different jobs, different blocks
    for base in firsts:
        assert base >= 1024 and (base + BLOCK <= ray_low or base >= ray_high)
    key = "/runs/a/tasks/0/logs/engines"
    assert next(port_blocks(key)) == next(port_blocks(key))
    monkeypatch.setenv("SLIME_ENGINE_PORT_RANGE", "40000-41000")
    assert all(40000 <= b < 41000 for b in port_blocks(key))
    monkeypatch.setenv("SLIME_RAY_PORT_RANGE", "40000-50000")
    with pytest.raises(LaunchError, match="overlap Ray's 40000-50000 .SLIME_RAY_PORT_RANGE.; set SLIME_ENGINE_PORT"):
        next(port_blocks(key))
    monkeypatch.setenv("SLIME_ENGINE_PORT_RANGE", "40000")
    with pytest.raises(LaunchError, match="SLIME_ENGINE_PORT_RANGE='40000': expected LOW-HIGH"):
        next(port_blocks(key))


def test_trust_remote_code_follows_auto_map(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN25_7B, "auto_map": {"AutoModel": "x.Y"}}))
    cmds = engine_commands(_spec(f"model.path={tmp_path}"))
    assert all("--trust-remote-code" in c.argv for c in cmds)
    assert all("--trust-remote-code" not in c.argv for c in engine_commands(_spec()))


def test_router_only_for_several_engines_with_router_args():
    # validate refuses router_args (the rollout manager does not use the router); the command builder still
    # converts them, for when it does
    spec = _with_sglang(router_args={"policy": "cache_aware"})
    cmd = router_command(spec, ["http://a:1", "http://b:2"], host="a")
    assert list(cmd.argv) == [
        "python",
        "-m",
        "sglang_router.launch_router",
        "--host",
        "a",
        "--port",
        "30000",
        "--worker-urls",
        "http://a:1",
        "http://b:2",
        "--policy",
        "cache_aware",
    ]
    assert router_command(spec, ["http://a:1"], host="a") is None


def test_non_sglang_specs_are_refused():
    with pytest.raises(LaunchError, match="rollout.backend is 'builtin'"):
        engine_commands(
            msgspec.structs.replace(_spec(), rollout=msgspec.structs.replace(_spec().rollout, backend="builtin"))
        )


def test_each_node_starts_only_its_own_engine_processes():
    from slime.backends.sglang.backend import process_specs

    multi = engine_commands(_spec("rollout.gpus_per_engine=16"), hosts=["a", "b"])
    on_b = process_specs(multi, {1})
    assert [(p.name, p.url, p.ports) for p in on_b] == [("engine0-node1", None, ())]
    on_a = process_specs(engine_commands(_spec(), hosts=["a", "b"]), {0})
    assert [p.name for p in on_a] == ["engine0", "engine1", "engine2", "engine3"]
    assert on_a[1].url == "http://a:30020" and on_a[1].ports == (30020, 30021)


def test_deterministic_sampling_starts_engines_in_sglangs_deterministic_mode():
    """SGLang 0.5.23 sets every request's sampling_seed to None unless the server runs with
    --enable-deterministic-inference (sampling/sampling_batch_info.py): reproducible sampling needs the flag."""
    plain = list(engine_commands(_spec())[0].argv)
    assert "--enable-deterministic-inference" not in plain
    argv = list(engine_commands(_spec("rollout.deterministic=true"))[0].argv)
    assert argv.count("--enable-deterministic-inference") == 1
    with pytest.raises(SpecError, match=r"sets --enable-deterministic-inference itself") as info:  # validate
        _spec("rollout.sglang.args.enable-deterministic-inference=true")
    assert "change rollout.deterministic: true instead" in str(info.value.problems[0].hint)
    valid = _spec()  # the launch refuses it too, naming the same field
    bad = _with_sglang_args({"enable-deterministic-inference": True}, valid)
    with pytest.raises(LaunchError, match=r"itself .*\(change rollout\.deterministic: true instead\)"):
        engine_commands(bad)


def test_moe_engines_take_an_expert_parallel_size_that_divides_their_tensor_parallel_size():

    from slime.backends.sglang.flags import EP_FLAGS as SPEC_EP_FLAGS
    from slime.backends.sglang.launch import EP_FLAGS

    assert EP_FLAGS is SPEC_EP_FLAGS  # the spec rule and the launcher know the same aliases
    argv = list(engine_commands(_spec("rollout.gpus_per_engine=4", "rollout.sglang.args.ep-size=4"))[0].argv)
    assert argv[argv.index("--tp-size") + 1] == "4" and argv[argv.index("--ep-size") + 1] == "4"
    valid = _spec("rollout.gpus_per_engine=4")
    for key in EP_FLAGS:  # validate refuses these already (sglang_expert_parallel); the launcher checks again
        bad = _with_sglang_args({key: 3}, valid)
        with pytest.raises(LaunchError, match=rf"sglang\.args\.{key}=3 must be a positive integer dividing .* size 4"):
            engine_commands(bad)


PD_SPEC = ROOT / "specs" / "grpo-pd.yaml"


def test_prefill_decode_groups_golden():
    """The 2-group example (1 prefill + 3 decode engines): layout table, role flags, no router."""
    _golden("sglang_grpo_pd.txt", render_engine_commands(_spec(path=PD_SPEC)))


def test_prefill_decode_role_flags_and_ports():
    spec = _spec("rollout.sglang.pd.prefill_engines=2", "rollout.sglang.pd.transfer=nixl", path=PD_SPEC)
    cmds = engine_commands(spec, hosts=["10.0.0.1", "10.0.0.2"])
    assert [c.role for c in cmds] == ["prefill", "prefill", "decode", "decode"]
    for c in cmds:
        argv = list(c.argv)
        assert argv[argv.index("--disaggregation-mode") + 1] == c.role
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
        assert ("--chunked-prefill-size" in argv) == (c.role == "prefill")
        assert ("--cuda-graph-max-bs-decode" in argv) == (c.role == "decode")
    # each prefill engine's bootstrap server on its own port (SGLang's default 8998 would clash on a node)
    assert [(c.bootstrap_port, c.ports) for c in cmds[:2]] == [
        (30013, (30010, 30011, 30013)),
        (30023, (30020, 30021, 30023)),
    ]
    assert all(c.bootstrap_port is None and len(c.ports) == 2 for c in cmds[2:])


def test_prefill_engine_spanning_nodes_gives_every_rank_the_bootstrap_port():
    spec = _spec("rollout.gpus_per_engine=8", "rollout.gpus=16", "cluster.nodes=3", path=PD_SPEC)
    cmds = engine_commands(spec)
    prefill = [c for c in cmds if c.role == "prefill"]
    assert [c.node_rank for c in prefill] == [0] and len(cmds) == 2
    spec = _spec("rollout.gpus_per_engine=16", "rollout.gpus=32", "cluster.nodes=5", path=PD_SPEC)
    prefill = [c for c in engine_commands(spec) if c.role == "prefill"]
    assert [c.node_rank for c in prefill] == [0, 1]
    assert all(c.argv[c.argv.index("--disaggregation-bootstrap-port") + 1] == "30013" for c in prefill)
    assert prefill[1].ports == () and prefill[0].ports == (30010, 30011, 30013)


def test_role_flags_are_checked_against_the_pinned_sglang():
    """Every flag the PD render adds is a launch_server flag of the pinned SGLang, with a value it accepts."""
    from slime.backends.sglang.flags import server_flags

    _, known = server_flags()
    argv = [a for c in engine_commands(_spec(path=PD_SPEC)) for a in c.argv if a.startswith("--")]
    assert {a[2:] for a in argv} <= known
    # choices of 0.5.23 (arg_groups/fields/disagg.py, choices.py): mode prefill|decode, transfer backends
    from slime.backends.sglang.profile import PrefillDecode

    transfer = msgspec.json.schema(PrefillDecode)["$defs"]["PrefillDecode"]["properties"]["transfer"]["enum"]
    assert set(transfer) <= {"mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"}


def test_role_args_may_not_reshape_an_engine_or_set_a_derived_flag():
    spec = _spec(path=PD_SPEC)
    pd = replace(spec.rollout.sglang.pd, decode_args={"pp-size": 2})
    with pytest.raises(LaunchError, match=r"decode_args.pp-size: slime sets --pp-size itself"):
        engine_commands(_with_sglang(spec, pd=pd))
    pd = replace(spec.rollout.sglang.pd, prefill_args={"disaggregation-mode": "decode"})
    with pytest.raises(LaunchError, match=r"prefill_args.disaggregation-mode.*change rollout.sglang.pd instead"):
        engine_commands(_with_sglang(spec, pd=pd))
