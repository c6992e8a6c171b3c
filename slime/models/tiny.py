"""The built-in tiny causal LM and its character-level tokenizer, built locally.

No model hub is reachable from CI, so quickstarts and tests use a small Qwen2- (or Llama-) shaped
network with random weights and one token per character, written as an ordinary HF checkpoint
that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline. Guaranteed: the same ``seed`` and
shape give bit-identical tensors (the global RNG untouched); any text round-trips exactly;
:func:`ensure_builtin_model` is idempotent and atomic, with builds cached per code and library
versions. Not guaranteed: identical tensors across torch/transformers versions. Why a byte-level
BPE without merges: see docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from collections.abc import Callable
from pathlib import Path

from slime.models.tokenizer import TINY_MARKER

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_ENV",
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "ensure_builtin_model",
    "shared_cache_dir",
]

PAD, BOS, EOS, IM_START, IM_END = "<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START, IM_END)
# Printable ASCII (space .. ~) plus newline get the first ids after the specials.
CHARACTERS = tuple(c for c in string.printable if c not in "\t\r\x0b\x0c")

# Qwen-style markup. Tools are listed in the system turn and tool calls are
# rendered as <tool_call>{json}</tool_call>, tool results as <tool_response>,
# so agent adapters can exercise a realistic round trip with this model.
# Tools are listed compactly as ``name(arg, ...)``, one per line: with one token
# per character and a 256-token context, a tool's full JSON schema would
# leave no room for a tool call, its result and an answer.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n' }}{%- endif %}"
    "{{- '<tools>' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool['function'] if tool.get('function') else tool %}"
    "{%- set props = (fn.get('parameters') or {}).get('properties') or {} %}"
    "{{- '\\n' + fn['name'] + '(' + (props | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message.get('tool_calls') %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call.get('function') else call %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Built-in models by name: keyword arguments for build_tiny_model.
# "tiny-agent" differs from "tiny" only in its initial weights: std 1/sqrt(hidden) (the fan-in scale) instead
# of GPT-2's 0.02, far too small at width 128. From 0.02 every attention score starts near 0 and its
# query and key weights each get a gradient proportional to the other, so learning to copy from the context (a
# tool call's argument from the prompt, an answer from the tool's result) waits on a long plateau whose length
# varies with the data order; at the fan-in scale the copies form much sooner (tests/bench/agent_warmup.py
# --init-std; numbers in docs/design-notes.md). "tiny" keeps its weights: the quickstart's and benches'
# published figures are for it.
BUILTIN_BUILDS: dict[str, dict[str, float]] = {"tiny": {}, "tiny-agent": {"init_std": 128**-0.5}}
BUILTIN_MODELS = tuple(BUILTIN_BUILDS)


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map (what ByteLevel pre-tokenizers emit)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def build_tiny_tokenizer():
    """Return the tokenizer: specials at ids 0..4, then one token per byte.

    Printable ASCII and ``\\n`` come first (ids 5..100) so the task-relevant
    characters have small, stable ids; the other 160 bytes follow so that any
    UTF-8 text encodes and round-trips instead of being dropped. There are no
    merges, so every ASCII character is exactly one token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = _byte_symbols()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[symbols[ord(ch)]] = len(vocab)
    for b in range(256):
        vocab.setdefault(symbols[b], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def _save_tokenizer(tokenizer, out: Path) -> None:
    """Save, then rewrite tokenizer_config.json in the form transformers 4.4x-5.x all read.

    transformers 5 writes ``tokenizer_class: TokenizersBackend``, a list-valued
    ``extra_special_tokens`` and a separate ``chat_template.jinja``; 4.x (what
    SGLang images pin) knows none of these.
    """
    tokenizer.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("extra_special_tokens", None)
    cfg.pop("backend", None)
    cfg["additional_special_tokens"] = [IM_START, IM_END]
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["model_max_length"] = 1 << 20
    cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def _config(
    arch: str,
    vocab_size: int,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_position: int,
    init_std: float,
    ids: dict[str, int],
):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=init_std,
        pad_token_id=ids[PAD],
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        dtype="float32",
    )
    if arch == "qwen2":
        return Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "llama":
        return LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise ValueError(f"arch={arch!r} is not supported by the tiny model builder; use 'qwen2' or 'llama'")


def _check_shape(*, hidden, layers, heads, kv_heads, max_position, init_std) -> None:
    """Reject a shape ``build_tiny_model`` cannot build, naming the bad argument."""
    for name, value in (
        ("hidden", hidden),
        ("layers", layers),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("max_position", max_position),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"build_tiny_model: {name} must be a positive integer, got {value!r}")
    if not init_std > 0:
        raise ValueError(f"build_tiny_model: init_std must be > 0, got {init_std!r}")
    if hidden % heads or heads % kv_heads or (hidden // heads) % 2:
        raise ValueError(
            f"build_tiny_model: need hidden % heads == 0, heads % kv_heads == 0 and an even head dim; "
            f"got hidden={hidden}, heads={heads}, kv_heads={kv_heads}"
        )


def _generation_config(ids: dict):
    """Plain sampling defaults; both end tokens stop generation."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=ids[BOS],
        pad_token_id=ids[PAD],
        eos_token_id=[ids[EOS], ids[IM_END]],
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    arch: str = "qwen2",
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_position: int = 256,
    init_std: float = 0.02,
) -> Path:
    """Write a randomly initialised HF checkpoint to ``out_dir`` and return its path.

    ``intermediate`` defaults to ``3 * hidden`` (about 0.79M parameters at the
    default shape); ``init_std`` is the normal initialiser's standard deviation
    (transformers' ``initializer_range``). ``out_dir`` may exist; files in it are overwritten.
    """
    import torch
    from transformers import AutoModelForCausalLM

    _check_shape(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, max_position=max_position, init_std=init_std
    )
    intermediate = 3 * hidden if intermediate is None else intermediate
    shape = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        max_position=max_position,
        init_std=init_std,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = _config(arch, len(tokenizer), **shape, ids=ids)
    # fork_rng: deterministic init without disturbing the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = _generation_config(ids)
    model.save_pretrained(out, safe_serialization=True)
    _save_tokenizer(tokenizer, out)
    marker = {"seed": seed, "arch": arch, **shape}
    (out / TINY_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return out


CACHE_ENV = "SLIME_CACHE_DIR"


def shared_cache_dir() -> Path:
    """Where built models are kept across runs: ``$SLIME_CACHE_DIR``, else ``$XDG_CACHE_HOME/slime-submit``,
    else ``~/.cache/slime-submit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slime-submit"


def build_key(name: str) -> str:
    """What a built model depends on: this module's code and the torch / transformers versions (their
    initialisers may change). A build is reused across runs only under the same key."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(Path(__file__).read_bytes())
    for pkg in ("torch", "transformers"):
        try:
            h.update(f"{pkg}={version(pkg)};".encode())
        except PackageNotFoundError:
            h.update(f"{pkg}=none;".encode())
    return f"{name}-{h.hexdigest()[:16]}"


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in ("config.json", "tokenizer.json", "model.safetensors", TINY_MARKER))


def _atomic_dir(dest: Path, fill: Callable[[Path], object]) -> None:
    """``fill`` a temporary sibling of ``dest`` and rename it into place, so a reader never sees a
    half-written ``dest``; losing the race to another process's finished ``dest`` is fine."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fill(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not _complete(dest):  # not another process's finished copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _copy_of(src: Path) -> Callable[[Path], object]:
    return lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True)


def ensure_builtin_model(name: str, cache_dir: str | os.PathLike, *, shared: bool = True) -> Path:
    """Return the directory of built-in model ``name`` under ``cache_dir``, building it once.

    With ``shared`` (the default) a build is also kept in :func:`shared_cache_dir` under its
    :func:`build_key` and copied from there by later runs: building imports transformers' model code and
    costs seconds of CPU at every run's start. The run's own copy stays in ``cache_dir`` (the run dir
    records the exact model it trained). A shared cache that cannot be written is skipped.

    Safe to call concurrently from several processes: each builds (or copies) in its own
    temporary directory and renames it into place; the loser discards its copy.
    """
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; valid names: {', '.join(BUILTIN_MODELS)}")
    cache = Path(cache_dir)
    final = cache / name
    if (final / "config.json").is_file() and (final / "tokenizer.json").is_file():
        return final
    kept = shared_cache_dir() / build_key(name) if shared else None
    if kept is not None and _complete(kept):
        _atomic_dir(final, _copy_of(kept))
        return final
    _atomic_dir(final, lambda tmp: build_tiny_model(tmp, **BUILTIN_BUILDS[name]))
    if kept is not None:
        try:
            _atomic_dir(kept, _copy_of(final))
        except OSError:  # a read-only or full home: this run built, the next one builds again
            pass
    return final
