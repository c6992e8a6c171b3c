"""The engines' option tables that validate reads: generated from the pinned megatron-core and SGLang.

``slime/backends/megatron/options.json`` (``gen_options``) and ``slime/backends/sglang/server_args.json``
(``gen_server_args``) must name the versions in patches/pins.toml; the SGLang parser is checked on a
small wheel written here, the megatron table against the installed megatron-core when it is the pin.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from slime.backends.megatron import gen_options
from slime.backends.sglang import gen_server_args
from slime.backends.sglang.flags import EP_FLAGS, PP_FLAGS, SGLANG_RESERVED, server_flags

ROOT = Path(__file__).resolve().parents[2]
PINS = tomllib.loads((ROOT / "patches" / "pins.toml").read_text())


def test_the_tables_are_of_the_pinned_versions():
    options = json.loads(gen_options.OUT.read_text())
    assert options["megatron_core"] == PINS["megatron-core"]["version"]
    server = json.loads(gen_server_args.OUT.read_text())
    assert server["sglang"] == PINS["sglang"]["version"]
    assert PINS["sglang"]["sha256"][server["source"]["wheel"]] == server["source"]["sha256"]
    assert options["options"] == sorted(set(options["options"])) and server["flags"] == sorted(set(server["flags"]))


def test_the_flags_slime_submit_names_are_flags_of_the_pinned_sglang():
    _, flags = server_flags()
    assert set(SGLANG_RESERVED) | set(EP_FLAGS) | set(PP_FLAGS) <= flags
    assert {"mem-fraction-static", "cuda-graph-max-bs-decode", "enable-memory-saver", "trust-remote-code"} <= flags


def test_the_megatron_table_is_what_the_installed_megatron_core_gives():
    core = pytest.importorskip("megatron.core")
    if core.__version__ != PINS["megatron-core"]["version"]:
        pytest.skip(f"megatron-core {core.__version__} is not the pinned one")
    assert gen_options.options() == json.loads(gen_options.OUT.read_text())


_FIELDS = """
    class Par(msgspec.Struct):
        _NS_PATH = "par"
        tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
        mem_fraction: A[float, "a help string"] = 0.5
        hidden: A[int, Arg(help="no flag", no_cli=True)] = 0
        renamed_field: A[str, Arg(cli_name="--other-name")] = ""
        rank: A[int, Derived(doc="set at run time")] = 0
        plain: int = 0
"""
_SERVER = """
    from sglang.srt.arg_groups.fields.par import Par
    class ServerArgs:
        @staticmethod
        def add_cli_args(parser):
            add_cli_args_from_dataclass(parser, ServerArgs)
            parser.add_argument("--config", type=str)
            parser.add_argument("--disable-x", "--old-x", action="store_true")
    _INPUT_NAMESPACES = [Par]
"""


def test_the_sglang_parser_reads_fields_aliases_and_manual_flags(tmp_path, monkeypatch):
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/_version.py", "__version__ = '9.9.9'\n__commit_id__ = 'abc'\n")
        z.writestr("sglang/srt/server_args.py", textwrap.dedent(_SERVER))
        z.writestr("sglang/srt/arg_groups/fields/par.py", textwrap.dedent(_FIELDS))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pins = tmp_path / "pins.toml"
    pins.write_text(f'[sglang]\nversion = "9.9.9"\n[sglang.sha256]\n"{wheel.name}" = "{digest}"\n')
    monkeypatch.setattr(gen_server_args, "PINS", pins)
    table = gen_server_args.server_args(wheel)
    assert table["sglang"] == "9.9.9" and table["source"] == {"wheel": wheel.name, "sha256": digest, "commit": "abc"}
    assert table["flags"] == [
        "config",
        "disable-x",
        "mem-fraction",
        "old-x",
        "other-name",
        "tensor-parallel-size",
        "tp-size",
    ]
    pins.write_text('[sglang]\nversion = "9.9.9"\n[sglang.sha256]\n')
    with pytest.raises(SystemExit, match="not a wheel pinned"):
        gen_server_args.server_args(wheel)
