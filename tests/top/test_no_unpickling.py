"""No code in nvtrain reads data back through Python's full unpickler (docs/security.md).

A static guard beside the behavioural tests (tests/worker/test_forged_state.py): every
``torch.load`` in ``src/nvtrain`` passes ``weights_only=True``, nothing calls ``pickle.load(s)``,
``marshal`` or ``shelve``, and the only ``pickle.Unpickler`` subclasses are the allow-listed ones
of ``ALLOWED_UNPICKLERS``, whose ``find_class`` refuses what they do not list.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
ALLOWED_UNPICKLERS = {
    # DCP's .metadata: admits only the classes DCP's metadata is made of (tests/worker/test_forged_state.py)
    "nvtrain/worker/plain.py",
    # The rendezvous state NVRx and torch unpickle from the store: admits only that state's own
    # classes, so a peer that writes the key runs nothing (tests/launcher/test_store_guard.py)
    "nvtrain/nvrx/storeguard.py",
    # The rank states NVRx's in-process stores unpickle: admits only NVRx's State and Mode
    # (tests/worker/test_worker_store_guard.py)
    "nvtrain/nvrx/inprocess_store.py",
}


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found.append((ast.unparse(node.func), node))
    return found


def _problems(path: Path, root: Path = SRC.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(root)
    problems = []
    for name, call in _calls(tree):
        line = f"{where}:{call.lineno}"
        if name.endswith("torch.load"):
            weights = [k for k in call.keywords if k.arg == "weights_only"]
            if not weights or not (
                isinstance(weights[0].value, ast.Constant) and weights[0].value.value is True
            ):
                problems.append(f"{line}: torch.load without weights_only=True")
        if name in {"pickle.load", "pickle.loads", "marshal.load", "marshal.loads", "shelve.open"}:
            problems.append(f"{line}: {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b) for b in node.bases}
            if "pickle.Unpickler" in bases and where.as_posix() not in ALLOWED_UNPICKLERS:
                problems.append(f"{where}:{node.lineno}: an unpickler outside {sorted(ALLOWED_UNPICKLERS)}")
        if isinstance(node, ast.ImportFrom) and node.module in {"pickle", "marshal", "shelve"}:
            problems.append(f"{where}:{node.lineno}: from {node.module} import ...")
    return problems


def test_nothing_in_src_unpickles_with_the_full_unpickler() -> None:
    problems = [p for path in sorted(SRC.rglob("*.py")) for p in _problems(path)]
    assert problems == []


def test_the_guard_catches_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "nvtrain" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "import pickle, torch\n"
        "torch.load('x', weights_only=False)\n"
        "torch.load('y')\n"
        "pickle.loads(b'')\n"
        "class U(pickle.Unpickler): pass\n",
        encoding="utf-8",
    )
    problems = _problems(bad, tmp_path)
    assert len(problems) == 4, problems


def test_the_metadata_unpickler_refuses_a_callable_it_does_not_list() -> None:
    pytest.importorskip("torch")
    from nvtrain.worker.plain import Refused, read_metadata

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, ("true",))

    import io

    with pytest.raises(Refused, match="os.system|posix.system"):
        read_metadata(io.BytesIO(pickle.dumps(Boom())))
