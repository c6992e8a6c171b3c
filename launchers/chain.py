"""Job chains: specs run one after another, each after the previous one succeeded (``on="ok"``) or ended.

:func:`plan` validates every step before anything is submitted: unique step names (the specs'
``name``), ``${runs.STEP.OUTPUT}`` references (``slime.spec.refs``) to earlier single-task steps,
and each step's spec with its references filled in by the earlier step's would-be paths (passed
as ``--set`` overrides, so lock.json records them). :func:`submit` submits in order; SLURM gets
``--dependency=afterok:``/``afterany:`` (and ``--kill-on-invalid-dep``, so a step whose
dependency can never be met ends instead of pending forever); local runs run in order and stop
after a failure. ``chain.json`` records the chain; ``chain_refs.json`` the filled references (checked on the node).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from launchers.base import DryRun, Launcher, RunFile, SubmitOptions
from slime.core.paths import RunPaths, TaskPaths, atomic_write
from slime.spec import SpecError
from slime.spec.errors import Origin, Problem
from slime.spec.refs import FieldRefs, find_refs, substitute

__all__ = ["Step", "cancel_after", "plan", "read_chain", "submit"]

On = Literal["ok", "any"]
Loader = Callable[..., Any]


@dataclass(slots=True)
class Step:
    """One spec of a chain: its file, name, references, and once planned its dry run and outputs."""

    file: str
    name: str
    refs: list[FieldRefs]
    dry: DryRun | None = None
    inputs: list[dict[str, str]] = field(default_factory=list)  # resolved references (recorded)
    job_ids: tuple[str, ...] = ()
    returncode: int | None = None
    note: str | None = None  # why it did not run

    @property
    def run_dir(self) -> Path | None:
        return self.dry.request.run_dir if self.dry else None

    def outputs(self) -> dict[str, str]:
        if self.run_dir is None:
            raise RuntimeError(f"internal: chain step {self.name!r} has no run dir before its outputs are named")
        tp = TaskPaths(self.run_dir, 0)
        return {"final_model": str(tp.final_model), "checkpoints": str(tp.checkpoints), "run_dir": str(self.run_dir)}


def _problem(file: str, path: str, message: str, hint: str | None = None) -> Problem:
    return Problem(path=path, message=message, hint=hint, origin=Origin(file=file))


def _scan(file: str, overrides: tuple[str, ...]) -> tuple[str, list[FieldRefs], list[Problem]]:
    """The spec's name and references (after ``overrides``); problems the loader would not report."""
    from slime.spec.overrides import apply_value, parse_override
    from slime.spec.yamlmarks import load_yaml

    try:
        data, _ = load_yaml(Path(file).read_text(), file)
    except (OSError, UnicodeDecodeError) as exc:
        return "", [], [_problem(file, "", f"cannot read the spec: {exc}")]
    except SpecError as exc:
        return "", [], list(exc.problems)
    if not isinstance(data, dict):
        return "", [], []  # the loader says what is wrong
    for text in overrides:
        parsed = parse_override(text)
        if not isinstance(parsed, Problem):
            apply_value(data, *parsed)
    refs, problems = find_refs(data)
    name = data.get("name")
    return (name if isinstance(name, str) else ""), refs, [replace(p, origin=Origin(file=file)) for p in problems]


def _check_refs(steps: list[Step]) -> list[Problem]:
    problems, seen = [], {}
    for i, st in enumerate(steps):
        if st.name in seen:
            problems.append(
                _problem(
                    st.file,
                    "name",
                    f"step name {st.name!r} is also step {seen[st.name] + 1}'s",
                    "give each step's spec its own name",
                )
            )
        for fr in st.refs:
            for ref in fr.refs:
                if seen.get(ref.step) is None:
                    where = "a later step" if ref.step in {s.name for s in steps[i:]} else "no step of this chain"
                    problems.append(
                        _problem(
                            st.file,
                            fr.field,
                            f"{ref.text} names {where}",
                            f"earlier steps: {', '.join(s.name for s in steps[:i]) or 'none'}",
                        )
                    )
        seen.setdefault(st.name, i)
    return problems


def _load_step(st: Step, overrides: tuple[str, ...], filled: list[str], load_checked: Loader):
    """Load a step's spec with its references filled in; a filled path need not exist yet."""
    ref_fields = {fr.field for fr in st.refs}
    try:
        return load_checked(st.file, overrides=(*overrides, *filled), check_paths=True)
    except SpecError as exc:
        other = [p for p in exc.problems if not (p.path in ref_fields and "not found" in p.message)]
        if other:
            raise SpecError(other) from None
    loaded = load_checked(st.file, overrides=(*overrides, *filled), check_paths="warn")
    warnings = tuple(p for p in loaded.warnings if not (p.path in ref_fields and "not found" in p.message))
    return replace(loaded, warnings=warnings)


def _fill(st: Step, steps: list[Step]) -> list[str]:
    """``--set`` texts filling ``st``'s references from the earlier steps' outputs (recorded in ``inputs``)."""
    by_name = {s.name: s for s in steps if s.run_dir is not None}
    outputs = {(name, out): path for name, s in by_name.items() for out, path in s.outputs().items()}
    filled = []
    for fr in st.refs:
        value = substitute(fr.value, outputs)
        filled.append(f"{fr.field}={json.dumps(value)}")
        for ref in fr.refs:
            path = outputs[(ref.step, ref.output)]
            st.inputs.append({"field": fr.field, "ref": ref.text, "step": ref.step, "output": ref.output, "path": path})
    return filled


def _check_outputs(st: Step, steps: list[Step]) -> list[Problem]:
    """A referenced step must be one task, and write ``final_model`` if that is what is referenced."""
    problems = []
    for ref in {(r.step, r.output) for fr in st.refs for r in fr.refs}:
        src = next(s for s in steps if s.name == ref[0])
        loaded = src.dry.request.loaded  # type: ignore[union-attr]
        if loaded.is_sweep:
            problems.append(
                _problem(
                    st.file,
                    "",
                    f"${{runs.{ref[0]}.{ref[1]}}}: step {ref[0]!r} is a sweep",
                    "reference a single-task step",
                )
            )
        if ref[1] == "final_model" and not loaded.spec.train.checkpoint.save_hf:
            problems.append(
                _problem(
                    src.file,
                    "train.checkpoint.save_hf",
                    f"step {ref[0]!r} writes no final_model, which step {st.name!r} uses",
                    "set train.checkpoint.save_hf: true in it",
                )
            )
    return problems


def plan(
    files: list[str], overrides: tuple[str, ...], options: SubmitOptions, load: Loader
) -> tuple[Launcher, list[Step]]:
    """Validate and dry-run every step (nothing is written); SpecError lists every problem found.
    ``load``: the CLI's spec loader, ``load(file, overrides=..., check_paths=...) -> LoadedSpec``."""
    from launchers import get_launcher

    if len(files) < 2:
        raise SpecError(
            [Problem(path="", message="a chain needs at least two specs", hint="slime-submit chain A.yaml B.yaml")]
        )
    steps, problems = [], []
    for f in files:
        name, refs, found = _scan(f, overrides)
        problems += found
        steps.append(Step(file=f, name=name or Path(f).stem, refs=refs))
    problems += _check_refs(steps)
    if problems:
        raise SpecError(problems)
    launcher = None
    for st in steps:
        loaded = _load_step(st, overrides, _fill(st, steps), load)
        name = loaded.spec.cluster.launcher
        if launcher is not None and name != launcher.name:
            raise SpecError(
                [
                    _problem(
                        st.file,
                        "cluster.launcher",
                        f"{name!r}, but the chain's first step uses {launcher.name!r}",
                        "run every step of a chain with one launcher",
                    )
                ]
            )
        launcher = launcher or get_launcher(name)
        st.dry = launcher.dryrun(loaded, options)
        problems += _check_outputs(st, steps)
    if problems:
        raise SpecError(problems)
    if launcher is None:
        raise RuntimeError("internal: a chain with no steps reached submission")
    return launcher, steps


# ----------------------------------------------------------------------------- submit and record
def _record(steps: list[Step], on: On, chain_id: str) -> None:
    """Write ``chain.json`` into every submitted step's run dir (each holds the whole chain)."""
    doc_steps = [
        {
            "name": s.name,
            "spec": s.file,
            "run_dir": str(s.run_dir) if s.job_ids or s.returncode is not None else None,
            "job_ids": list(s.job_ids),
            "returncode": s.returncode,
            "note": s.note,
            "inputs": s.inputs,
        }
        for s in steps
    ]
    for i, step in enumerate(doc_steps):
        root = step["run_dir"]
        if root is None:
            continue
        doc = {
            "chain": chain_id,
            "index": i,
            "on": on,
            "recorded_at": time.time(),
            "steps": doc_steps,
        }
        atomic_write(RunPaths(Path(root)).chain, json.dumps(doc, indent=2) + "\n")


def _dependency(prev: Step, on: On) -> str:
    return f"{'afterok' if on == 'ok' else 'afterany'}:{':'.join(prev.job_ids)}"


def _stop_after(launcher: Launcher, prev: Step, on: On) -> str | None:
    """Why a local chain stops after ``prev`` ran (None: go on): it failed (``on="ok"``) or was cancelled."""
    from slime.core.states import RunState

    if prev.run_dir and launcher.status(RunPaths(prev.run_dir)).state == RunState.CANCELLED:
        return f"not started: step {prev.name!r} was cancelled"
    if prev.returncode and on == "ok":
        return f"not started: step {prev.name!r} ended with exit code {prev.returncode}"
    return None


def submit(launcher: Launcher, steps: list[Step], on: On) -> list[Step]:
    """Submit (SLURM) or run (local) the planned steps in order; returns them with ids/exit codes."""
    chain_id = steps[0].run_dir.name if steps[0].run_dir else "chain"
    prev: Step | None = None
    for i, st in enumerate(steps):
        if st.dry is None:
            raise RuntimeError(f"internal: chain step {i} was not planned before submission")
        dry = st.dry
        if prev is not None and prev.job_ids:
            extra = {**dry.options.extra, "dependency": _dependency(prev, on), "kill_on_invalid_dep": True}
            dry = replace(dry, options=replace(dry.options, extra=extra))
        elif prev is not None:  # local: the previous step ran already
            why = _stop_after(launcher, prev, on)
            if why:
                for later in steps[i:]:
                    later.note = why
                break
        if st.inputs:  # written with the run dir, so the node finds it whenever the scheduler starts the step
            refs = RunFile(RunPaths(Path(".")).chain_refs.as_posix(), json.dumps(st.inputs, indent=2) + "\n", 0o644)
            dry = replace(dry, request=replace(dry.request, files=(*dry.request.files, refs)))
        try:
            sub = launcher.submit(dry)
        except BaseException:  # the earlier steps stay queued: their records say this one was not
            for later in steps[i:]:
                later.note = f"not submitted: submitting step {st.name!r} failed"
            _record(steps, on, chain_id)
            raise
        st.job_ids, st.returncode = sub.job_ids, (None if sub.job_ids else sub.returncode)
        _record(steps, on, chain_id)
        prev = st
    _record(steps, on, chain_id)
    return steps


def read_chain(paths: RunPaths) -> dict[str, Any] | None:
    """The run's ``chain.json`` (None: not a chain step, or a damaged record)."""
    try:
        doc = json.loads(paths.chain.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("steps"), list) and isinstance(doc.get("index"), int)
    return doc if ok and all(isinstance(s, dict) for s in doc["steps"]) else None


def _step_status(step: dict[str, Any]):
    """(RunPaths, its launcher's RunStatus) of a recorded step, or None when it never got a run dir."""
    from launchers import get_launcher
    from launchers.status import launcher_name

    if not step.get("run_dir") or not Path(step["run_dir"]).is_dir():
        return None
    paths = RunPaths(Path(step["run_dir"]))
    launcher = get_launcher(launcher_name(paths))
    return paths, launcher, launcher.status(paths)


def chain_states(paths: RunPaths) -> dict[str, Any] | None:
    """The run's chain with each step's current state (``status``/``list`` show it), or None."""
    doc = read_chain(paths)
    if doc is None:
        return None
    steps = []
    for i, step in enumerate(doc["steps"]):
        found = _step_status(step) if i != doc["index"] else None
        state = found[2].state if found else None
        steps.append({**step, "step": i + 1, "state": state, "this": i == doc["index"]})
    return {
        "chain": doc.get("chain"),
        "on": doc.get("on"),
        "index": doc["index"],
        "steps": steps,
        "inputs": steps[doc["index"]].get("inputs", []),
    }


def cancel_after(paths: RunPaths) -> list[dict[str, Any]]:
    """Cancel every later step of ``paths``'s chain that has not started yet; what was cancelled."""
    from slime.core.states import RunState

    doc = read_chain(paths)
    out: list[dict[str, Any]] = []
    for step in (doc or {"steps": [], "index": 0})["steps"][doc["index"] + 1 if doc else 0 :]:
        found = _step_status(step)
        if found and found[2].state == RunState.PENDING:
            result = found[1].cancel(found[0])
            out.append({"name": step.get("name"), "run_dir": step["run_dir"], "cancelled": list(result.cancelled)})
    return out
