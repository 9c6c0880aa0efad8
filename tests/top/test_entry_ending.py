"""Two things of ``nvtrain.entry``'s ending, as real processes (standard library only):

- a file left open (held by a module) is flushed at the script's end even when it was made
  before the heap was frozen through ``nvtrain.entry.freeze`` (as the worker library freezes
  what exists when training starts): frozen objects are not among those ``gc.get_objects()``
  lists;
- the script's globals outlive it, as ``__main__``'s do under ``python SCRIPT``: its objects are
  alive for its ``atexit`` handlers and are never freed (a DDP model freed when the script
  returned could deadlock in gloo's destructor);
- a program's ``main()`` (ft_launcher's, not a script) ends through ``call`` and ``finish`` with
  the exit code and output Python gives it, without the finalization that would abort it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.proc_helpers import BIN

FROZEN = """
import sys
import holder
from nvtrain.entry import freeze
holder.log = open(sys.argv[1], "w")  # left open in a module: not freed when the script ends
holder.log.write("written before the end")
freeze()
"""

KEPT = """
import atexit

class Noisy:
    def __del__(self):
        print("FREED", flush=True)

model = Noisy()
atexit.register(lambda: print("AT EXIT", type(model).__name__, flush=True))
print("SCRIPT DONE", flush=True)
"""

# As ftmain would end ft_launcher: a main() that is a function, then finish().
PROGRAM = """
import sys
from kept_at_exit import AbortsWhenFreed, keep
from nvtrain.entry import call, finish

def main():
    keep(AbortsWhenFreed())  # the interpreter's finalization would abort the process
    how = sys.argv[1]
    print("PROGRAM RAN", flush=True)
    if how == "exit":
        sys.exit(int(sys.argv[2]))
    if how == "raise":
        raise RuntimeError("boom in main")
    if how == "interrupt":
        raise KeyboardInterrupt

finish(call(main))
"""


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NVTRAIN_ZYGOTE"}
    env["PYTHONPATH"] = os.pathsep.join([str(BIN), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_a_file_made_before_gc_freeze_is_flushed(tmp_path: Path) -> None:
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN, encoding="utf-8")
    (tmp_path / "holder.py").write_text("log = None\n", encoding="utf-8")
    for name, prefix in (("python", [sys.executable]), ("entry", [sys.executable, "-m", "nvtrain.entry"])):
        out = tmp_path / f"{name}.log"
        done = _run([*prefix, str(script), str(out)], tmp_path)
        assert done.returncode == 0, (name, done)
        assert out.read_text(encoding="utf-8") == "written before the end", name


def test_the_scripts_objects_outlive_it(tmp_path: Path) -> None:
    script = tmp_path / "kept.py"
    script.write_text(KEPT, encoding="utf-8")
    python = _run([sys.executable, str(script)], tmp_path)
    # python frees __main__'s objects only in its finalization, after the atexit handlers.
    assert python.stdout == "SCRIPT DONE\nAT EXIT Noisy\nFREED\n", python
    entry = _run([sys.executable, "-m", "nvtrain.entry", str(script)], tmp_path)
    # nvtrain.entry skips that finalization: the object is never freed, not freed early.
    assert entry.returncode == 0, entry
    assert entry.stdout == "SCRIPT DONE\nAT EXIT Noisy\n", entry


@pytest.mark.parametrize(
    ("args", "code", "stderr"),
    [
        (["return"], 0, ""),
        (["exit", "5"], 5, ""),
        (["raise"], 1, "RuntimeError: boom in main\n"),
        (["interrupt"], -signal.SIGINT, "KeyboardInterrupt\n"),
    ],
)
def test_a_programs_main_ends_through_call(tmp_path: Path, args: list[str], code: int, stderr: str) -> None:
    done = _run([sys.executable, "-c", PROGRAM, *args], tmp_path)
    assert done.returncode == code, done
    assert done.stdout == "PROGRAM RAN\n", done
    assert done.stderr.endswith(stderr), done.stderr
