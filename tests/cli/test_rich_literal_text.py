"""Text a user gave (a flag's value, a path, a policy's value) is printed as written, through
the real CLI: rich turns no emoji code (``:x:``) into a picture and reads no markup
(``[bold]``) in it, in errors, findings and ``validate``'s effective policy. In a pipe and on a
terminal (a real pseudo-terminal, where ``validate`` prints through rich's tables too)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def nvtrain(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def nvtrain_on_a_terminal(cwd: Path, *args: str) -> tuple[int, str]:
    """Exit status and what ``nvtrain ARGS`` wrote (stdout and stderr both on one pseudo-terminal,
    250 columns wide, so that nothing wraps), its terminal escapes removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvtrain", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child's end is closed (it exited)
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    code = proc.wait(timeout=120)
    return code, ANSI.sub("", b"".join(chunks).decode("utf-8", errors="replace"))


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text('[job]\nname = "llm"\nscript = "train.py"\n', encoding="utf-8")
    return path


def test_an_error_prints_the_flags_value_as_written(tmp_path: Path, policy: Path) -> None:
    done = nvtrain(tmp_path, "manifest", str(policy), "--volume", "pvc:x:/etc")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--volume pvc:x:/etc overlaps /etc/nvtrain" in done.stderr, done.stderr
    assert "\u274c" not in done.stderr, done.stderr  # the emoji :x: stands for

    done = nvtrain(tmp_path, "manifest", str(policy), "--qos", "[bold]a:x:b[/]")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--qos '[bold]a:x:b[/]' is not a QoS class" in done.stderr, done.stderr


def test_an_error_on_a_terminal_prints_the_flags_value_as_written(tmp_path: Path, policy: Path) -> None:
    code, said = nvtrain_on_a_terminal(tmp_path, "manifest", str(policy), "--volume", "pvc:x:/etc")
    assert code == 2, said
    assert "--volume pvc:x:/etc overlaps /etc/nvtrain" in said and "\u274c" not in said, said


def test_findings_on_a_terminal_print_the_value_as_written(tmp_path: Path) -> None:
    folder = tmp_path / "a:x:[bold]b"
    folder.mkdir()
    path = folder / "p.toml"
    path.write_text('[job]\nname = "llm"\nscript = "-m:x:[bold]n"\n', encoding="utf-8")
    code, said = nvtrain_on_a_terminal(tmp_path, "validate", str(path))
    assert code == 2, said
    assert f'{path}:3:1: error [job] script = "-m:x:[bold]n"' in said, said
    assert "\u274c" not in said, said


def test_validates_effective_policy_on_a_terminal_prints_values_as_written(tmp_path: Path) -> None:
    folder = tmp_path / "a:x:[bold]b"
    folder.mkdir()
    path = folder / "p.toml"
    path.write_text('[job]\nname = "llm"\nscript = "t:x:[bold]s.py"\n', encoding="utf-8")
    code, said = nvtrain_on_a_terminal(tmp_path, "validate", str(path))
    assert code == 0, said
    # The table's title, which rich folds to the table's width.
    assert f"{path} is valid" in said.replace("\r\n", ""), said
    assert "t:x:[bold]s.py" in said and "\u274c" not in said, said
