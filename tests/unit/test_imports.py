"""The control plane stays light: the spec, the CLI and the launcher interface import no heavy runtime.

Each check runs in a fresh interpreter (``sys.modules`` of this pytest process is
polluted by other tests) and lists which heavy top-level packages got imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "transformers", "megatron", "sglang", "e2b", "wandb", "aiohttp", "numpy")

_REPORT = """
import json, sys
{body}
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))
print('IMPORTS=' + json.dumps({{'heavy': heavy, 'jsonschema': 'jsonschema' in sys.modules, 'rc': rc}}))
"""


def _run(body: str, cwd: Path = ROOT) -> dict:
    code = _REPORT.format(body=body, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("IMPORTS=")]
    assert lines, f"no report (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("IMPORTS=") :]) | {"stdout": proc.stdout, "stderr": proc.stderr}


def test_importing_the_control_plane_pulls_in_nothing_heavy():
    out = _run(
        "import slime.spec, slime.migrate.importer, slime.cli.main, slime.cli.commands, slime.spec.layout, "
        "slime.core.paths, slime.core.registry, launchers, launchers.base, launchers.status, "
        "launchers.local.launcher, launchers.slurm.launcher, slime.backends.preview\nrc = 0"
    )
    assert out["heavy"] == [], out


def test_validate_imports_nothing_heavy_and_skips_jsonschema_for_a_valid_spec():
    out = _run(
        "from slime.cli.main import main\nrc = main(['validate', 'specs/quickstart.yaml', 'specs/grpo-multinode.yaml'])"
    )
    assert out["rc"] == 0, out
    assert out["heavy"] == [], out
    # jsonschema is only needed to list the problems of an invalid spec (slime.spec.load).
    assert out["jsonschema"] is False, out


def test_validate_of_a_bad_spec_imports_nothing_heavy():
    out = _run(
        "from slime.cli.main import main\nrc = main(['validate', 'specs/quickstart.yaml', "
        "'--set', 'rollout.temprature=0'])"
    )
    assert out["rc"] == 2 and "did you mean 'temperature'" in out["stdout"] + out["stderr"], out
    assert out["heavy"] == [], out


def test_render_imports_nothing_heavy(tmp_path: Path):
    """Render compiles through the launcher registry; whether or not the local launcher is present yet
    (exit 0, or 2 naming the missing plug-in), nothing heavy may be imported on the way."""
    shutil.copy(ROOT / "specs" / "quickstart.yaml", tmp_path / "quickstart.yaml")
    data = tmp_path / "data" / "arith"
    data.mkdir(parents=True)
    for name in ("train.jsonl", "heldout.jsonl"):
        (data / name).write_text('{"prompt": "01+02=", "label": "03"}\n')
    out = _run("from slime.cli.main import main\nrc = main(['render', 'quickstart.yaml'])", cwd=tmp_path)
    assert out["rc"] in (0, 2), out
    assert "Traceback" not in out["stderr"], out
    assert out["heavy"] == [], out


def test_render_of_a_gpu_spec_shows_the_engines_and_imports_nothing_heavy():
    """The Megatron and SGLang previews come from pure functions: render works on a laptop."""
    out = _run("from slime.cli.main import main\nrc = main(['render', 'specs/grpo-multinode.yaml'])")
    assert out["rc"] == 0 and out["heavy"] == [], out
    text = out["stdout"]
    assert "# ---- megatron-core arguments of the trainer ranks ----" in text
    assert "initialize_model_parallel(tensor_model_parallel_size=2" in text
    assert "# ---- SGLang engine commands; node addresses are filled in at run time ----" in text
    assert text.count("python -m sglang.launch_server") == 8 and "--tp-size 2" in text


def test_import_slime_args_imports_nothing_heavy(tmp_path: Path):
    flags = tmp_path / "flags.txt"
    flags.write_text("--hf-checkpoint /m --prompt-data /d.jsonl --num-rollout 3 --actor-num-gpus-per-node 2\n")
    out = _run(f"from slime.cli.main import main\nrc = main(['import-slime-args', {str(flags)!r}])")
    assert out["rc"] == 0, out
    assert out["heavy"] == [], out


@pytest.mark.parametrize(
    "module",
    ["slime.spec", "slime.cli.main", "launchers.base", "launchers.local.launcher", "launchers.slurm.launcher"],
)
def test_each_module_alone(module):
    out = _run(f"import {module}\nrc = 0")
    assert out["heavy"] == [], out


#: the import-linter contracts (pyproject.toml) of the control plane and the launchers' two sides
CONTROL_PLANE_CONTRACTS = (
    "control-plane-layers",
    "control-plane-light",
    "launchers-no-training-code",
    "launcher-sides-independent",
    "node-side-not-submit-side",
    "submit-side-not-node-side",
)


def test_the_control_plane_and_launcher_contracts_hold():
    """The layering, statically (function-level imports count): the CLI and the submit side import no
    engine, no training code, and the node side and submit side never import each other."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    args = [str(exe), "--no-cache"] + [a for c in CONTROL_PLANE_CONTRACTS for a in ("--contract", c)]
    proc = subprocess.run(
        args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and f"Contracts: {len(CONTROL_PLANE_CONTRACTS)} kept, 0 broken" in proc.stdout, (
        proc.stdout
    )
