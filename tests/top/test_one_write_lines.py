"""Every line nvtrain writes to stderr goes out in one write (a static guard beside the
behavioural tests in tests/cli/test_control_characters.py and tests/worker/test_logging.py).

Under ``PYTHONUNBUFFERED`` (which ``nvtrain run`` and most job images set) ``print(text,
file=sys.stderr)`` writes the text and its newline as two writes; the launcher, the warm-start
server and the workers share the job's stderr, so another process's line can land between them
and two lines become one (a worker's ``TRAIN step 8`` line once ended up inside an event line).
``sys.stderr.write(text + "\\n")`` is one write. The example training scripts (``demo``, the
starter's ``train.py``) print to stdout as their users' scripts do, and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
EXAMPLES = ("demo", "kube/starter")


def _two_write_prints(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            target = next((k.value for k in node.keywords if k.arg == "file"), None)
            if target is not None and ast.unparse(target) in {"sys.stderr", "sys.__stderr__"}:
                lines.append(node.lineno)
    return lines


def test_nothing_in_nvtrain_prints_a_line_to_stderr_in_two_writes() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if not path.relative_to(SRC).as_posix().startswith(EXAMPLES)
        for line in _two_write_prints(path)
    ]
    assert found == [], "use sys.stderr.write(text + '\\n') (one write) at " + ", ".join(found)


def test_the_guard_finds_such_a_print(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('import sys\nprint("a")\nprint("b", file=sys.stderr, flush=True)\n', encoding="utf-8")
    assert _two_write_prints(sample) == [3]
