"""The private framework API the integrations use, the versions they were built for, and the
check that guards each use.

Each integration reaches into its framework where no public hook exists (the Trainer's
checkpoint readers, Lightning's loaded-checkpoint slot, accelerate's singleton resets). Those
names may change in any release. For each framework this module records the supported range
(``low`` to ``high``) and, for each end, the facts the integration relies on: which private
methods exist with which parameters, which private attributes the framework's classes set.
``check`` compares them with the installed framework's own source before an integration
touches it: a use that is missing or changed is a ``Refused`` call (exit 2 under ``nvtrain
run``) that names the version found and the supported range, instead of an ``AttributeError``
deep in a run. A version outside the range whose facts match is used, with one line saying so.

``tests/integrations/test_private_api_facts.py`` checks the recorded facts against the source
of both ends: the installed version (CI's pin, the high end) and the wheel of the other end
(``scripts/fetch-framework-wheels`` downloads it). ``python -m nvtrain.integrations.private_api``
prints the ends as requirement lines (``transformers==5.17.0``), which that script reads.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FRAMEWORKS",
    "Framework",
    "Use",
    "check",
    "checked_reset_accelerate_state",
    "facts_in_source",
    "problems",
    "requirement_lines",
    "wheel_sources",
]


@dataclass(frozen=True)
class Use:
    """One private name an integration uses: ``owner.name`` in the framework's file ``path``;
    a method with ``params`` (``*args``/``**kwargs`` spelled so), or an attribute the class's
    own methods set on ``self`` (``params`` None)."""

    path: str
    owner: str
    name: str
    params: tuple[str, ...] | None = None

    def label(self, params: tuple[str, ...] | None = None) -> str:
        shown = self.params if params is None else params
        return f"{self.owner}.{self.name}" + ("" if shown is None else f"({', '.join(shown)})")


@dataclass(frozen=True)
class Framework:
    """A framework's supported range and the facts recorded at each end of it."""

    distribution: str
    integration: str
    low: str
    high: str
    recorded: Mapping[str, tuple[Use, ...]]
    """Each end's version -> the uses as that version's source has them."""

    @property
    def span(self) -> str:
        return f"{self.distribution} {self.low} to {self.high}"

    def uses(self) -> tuple[Use, ...]:
        """The uses (by owner and name), in the order recorded."""
        return self.recorded[self.high]


_TRAINER = "transformers/trainer.py"
_HF_USES = (
    Use(_TRAINER, "Trainer", "_load_from_checkpoint", ("self", "resume_from_checkpoint", "model")),
    Use(_TRAINER, "Trainer", "_load_optimizer_and_scheduler", ("self", "checkpoint")),
    Use(_TRAINER, "Trainer", "_load_scaler", ("self", "checkpoint")),
    Use(_TRAINER, "Trainer", "_load_rng_state", ("self", "checkpoint")),
    Use(_TRAINER, "Trainer", "_save_checkpoint", ("self", "model", "trial")),
    Use(_TRAINER, "Trainer", "_train_batch_size"),
)
_LIGHTNING_USES = (
    Use("lightning/pytorch/trainer/trainer.py", "Trainer", "_checkpoint_connector"),
    Use(
        "lightning/pytorch/trainer/connectors/checkpoint_connector.py",
        "_CheckpointConnector",
        "_loaded_checkpoint",
    ),
    Use("lightning/pytorch/loops/fit_loop.py", "_FitLoop", "_combined_loader"),
    Use("lightning/pytorch/callbacks/model_checkpoint.py", "ModelCheckpoint", "_every_n_train_steps"),
)
_ACCELERATE_USES = (
    Use("accelerate/state.py", "AcceleratorState", "_reset_state", ("reset_partial_state",)),
    Use("accelerate/state.py", "GradientState", "_reset_state", ()),
)

HF = Framework(
    "transformers", "nvtrain.integrations.hf", "5.17.0", "5.25.0", {"5.17.0": _HF_USES, "5.25.0": _HF_USES}
)
"""Both ends have the same facts (read from each one's source by the facts test)."""
LIGHTNING = Framework(
    "lightning",
    "nvtrain.integrations.lightning",
    "2.6.0",
    "2.6.6",
    {"2.6.0": _LIGHTNING_USES, "2.6.6": _LIGHTNING_USES},
)
ACCELERATE = Framework(
    "accelerate",
    "nvtrain.integrations.accelerate",
    "1.12.0",
    "1.16.0",
    {"1.12.0": _ACCELERATE_USES, "1.16.0": _ACCELERATE_USES},
)
FRAMEWORKS = {f.distribution: f for f in (HF, LIGHTNING, ACCELERATE)}

MISSING = "missing"


def _params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = function.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg is not None:
        names.append(f"*{a.vararg.arg}")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg is not None:
        names.append(f"**{a.kwarg.arg}")
    return tuple(names)


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """Names the class's methods assign on ``self`` (``self.x = ...``, annotated or augmented)."""
    found: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.add(target.attr)
    return found


def facts_in_source(
    source: str, uses: tuple[Use, ...]
) -> dict[tuple[str, str], tuple[str, ...] | None | str]:
    """What ``source`` (one file of a framework) has of ``uses`` (those of that file):
    ``(owner, name)`` -> a method's parameters, None for an attribute set on ``self``, or
    ``MISSING``."""
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    found: dict[tuple[str, str], tuple[str, ...] | None | str] = {}
    for use in uses:
        cls = classes.get(use.owner)
        result: tuple[str, ...] | None | str = MISSING
        if cls is not None:
            if use.params is None:
                result = None if use.name in _self_attributes(cls) else MISSING
            else:
                methods = [
                    n
                    for n in cls.body
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == use.name
                ]
                if methods:
                    result = _params(methods[-1])  # the last definition wins, as in Python
        found[(use.owner, use.name)] = result
    return found


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    if name.startswith("lightning.pytorch.") and "lightning.pytorch" not in sys.modules:
        if "pytorch_lightning" in sys.modules:  # the standalone package: the same files
            return "pytorch_lightning." + name.removeprefix("lightning.pytorch.")
    return name


@functools.cache
def _installed_source(path: str) -> str | None:
    spec = importlib.util.find_spec(_module_name(path))
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).read_text(encoding="utf-8")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def problems(framework: Framework, sources: Mapping[str, str | None]) -> list[str]:
    """Each use the files in ``sources`` (path -> text, None: not found) lack or have changed
    against every recorded end, as one phrase."""
    found: dict[tuple[str, str], tuple[str, ...] | None | str] = {}
    for path in {use.path for use in framework.uses()}:
        text = sources.get(path)
        mine = tuple(use for use in framework.uses() if use.path == path)
        if text is None:
            found.update({(use.owner, use.name): MISSING for use in mine})
        else:
            found.update(facts_in_source(text, mine))
    wrong = []
    for use in framework.uses():
        have = found[(use.owner, use.name)]
        accepted = {
            next(u.params for u in end if (u.owner, u.name) == (use.owner, use.name))
            for end in framework.recorded.values()
        }
        if have == MISSING:
            wrong.append(f"{use.label()} is missing")
        elif have not in accepted:
            assert not isinstance(have, str)
            wrong.append(f"{use.label()} is now {use.label(have)}")
    return wrong


def check(distribution: str, version: str, sources: Mapping[str, str | None] | None = None) -> None:
    """Refuse an installed framework whose private API differs from the recorded facts (a
    ``Refused`` naming the version, what changed and the supported range); one line when the
    version is outside the range but its facts match. ``sources``: the framework's files
    (path -> text) to read instead of the installed ones."""
    framework = FRAMEWORKS[distribution]
    if sources is None:
        sources = {path: _installed_source(path) for path in {u.path for u in framework.uses()}}
    wrong = problems(framework, sources)
    if wrong:
        from nvtrain.integrations.core import Refused  # (this module is read without torch too)

        raise Refused(
            f"{distribution} {version} is not a version {framework.integration} can use: the "
            f"private API it relies on differs ({'; '.join(wrong)}); it was built for "
            f"{framework.span}: install one of those, e.g. pip install "
            f"'{distribution}>={framework.low},<={framework.high}'"
        )
    key = _version_key(version)
    if not _version_key(framework.low) <= key <= _version_key(framework.high):
        _note_outside(distribution, version)


@functools.cache
def _note_outside(distribution: str, version: str) -> None:
    """Said once per process and version."""
    from nvtrain.worker.settings import say

    framework = FRAMEWORKS[distribution]
    say(
        f"{framework.distribution} {version} is outside the range {framework.integration} was built "
        f"for ({framework.span}); the private API it uses is as recorded, so it goes on"
    )


def wheel_sources(framework: Framework, wheel: Path) -> dict[str, str | None]:
    """The framework's files that hold its uses, read from a wheel (path -> text, None: absent)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return {
            path: archive.read(path).decode("utf-8") if path in names else None
            for path in {use.path for use in framework.uses()}
        }


def checked_reset_accelerate_state() -> None:
    """``core.reset_accelerate_state`` once accelerate's private API is checked (each attempt)."""
    from nvtrain.integrations import core

    accelerate = sys.modules.get("accelerate")
    if "accelerate.state" in sys.modules and accelerate is not None:
        check("accelerate", str(getattr(accelerate, "__version__", "?")))
    core.reset_accelerate_state()


def requirement_lines() -> list[str]:
    """``distribution==version`` for each end of each framework's range."""
    return [f"{f.distribution}=={end}" for f in FRAMEWORKS.values() for end in (f.low, f.high)]


if __name__ == "__main__":
    print("\n".join(requirement_lines()))
