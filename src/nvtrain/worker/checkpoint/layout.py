"""The on-disk layout of a run's checkpoints and the rules that make one count.

Owns the names (``step-<N>``, ``.partial-<token>``, ``.rejected-<token>``, ``manifest-rank<R>.json``,
``COMMITTED``), what a rank's manifest lists and how each file is hashed, what COMMITTED holds,
when a committed folder verifies, how a damaged folder is moved aside and what retention
deletes. Files only: no torch, no ranks (each function takes the rank and world it needs), so
these rules are tested with plain folders.

A checkpoint counts only when its folder is named ``step-<N>`` (a commit renames it whole) and
holds ``COMMITTED`` for that step, listing every file with its size and digest, each of which
matches. The protocol around these rules (who writes what, when) is in ``save`` and ``restore``.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import re
import secrets
import shutil
import zlib
from pathlib import Path
from typing import Any

__all__ = [
    "COMMITTED",
    "CorruptCheckpoint",
    "committed_steps",
    "fsync_dir",
    "missing_manifests",
    "move_aside",
    "os_error_text",
    "partial_dir",
    "partial_steps",
    "publish",
    "rank_files",
    "retain",
    "step_dir",
    "uncommitted_steps",
    "verify",
    "write_committed",
    "write_durable",
    "write_manifest",
]

COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_PARTIAL_DIR = re.compile(r"^step-(\d+)\.partial-[0-9a-f]+$")
_REJECTED_DIR = re.compile(r"^step-(\d+)\.rejected-[0-9a-f]+$")
_CHUNK = 8 << 20


class CorruptCheckpoint(RuntimeError):
    """A committed checkpoint whose files do not match their manifests."""


def _digest(path: Path) -> str:
    """xxh3-64 of a file (hex): what a manifest records since the format checked at 15 GB/s;
    zlib's CRC-32 took about 1 s per GB, on the path to every commit."""
    import xxhash

    hasher = xxhash.xxh3_64()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _crc(path: Path) -> int:
    """CRC-32 of a file: what manifests written before ``_digest`` hold."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(path: Path, data: bytes) -> None:
    """Write ``data`` to disk, then make it appear at ``path`` in one rename, the last thing done
    in that folder. A rank's manifest is published this way: once every rank's is there, rank 0
    commits and renames the partial folder, so a rank must not touch the old path afterwards (an
    fsync of the folder there failed with ENOENT under load, and a committed save was reported
    failed). The manifests' names become durable when rank 0 fsyncs the folder (``write_durable``
    of COMMITTED), which it does after reading them all and before the rename that commits."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_durable(path: Path, data: bytes) -> None:
    publish(path, data)
    fsync_dir(path.parent)


def os_error_text(exc: OSError) -> str:
    """``No space left on device (ENOSPC): /path`` (the path when the error names one)."""
    code = errno.errorcode.get(exc.errno or 0, "")
    text = (exc.strerror or str(exc)) + (f" ({code})" if code else "")
    return text + (f": {exc.filename}" if exc.filename else "")


# -- names -------------------------------------------------------------------------------------
def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:06d}"


def partial_dir(run_dir: Path, step: int, token: str) -> Path:
    """Where a save of ``step`` is written until it is committed (renamed to ``step_dir``)."""
    return run_dir / f"step-{step:06d}.partial-{token}"


def committed_steps(run_dir: Path) -> list[int]:
    """Steps of the committed checkpoints in ``run_dir``, oldest first."""
    steps = []
    if run_dir.is_dir():
        for entry in run_dir.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and (entry / COMMITTED).is_file():
                steps.append(int(match.group(1)))
    return sorted(steps)


def _matching(run_dir: Path, pattern: re.Pattern[str]) -> list[tuple[Path, int]]:
    if not run_dir.is_dir():
        return []
    found = []
    for entry in sorted(run_dir.iterdir()):
        match = pattern.match(entry.name)
        if match:
            found.append((entry, int(match.group(1))))
    return found


def uncommitted_steps(run_dir: Path) -> list[tuple[Path, int]]:
    """The step folders without COMMITTED (a commit is renamed in whole: these are damaged),
    with their steps, in name order."""
    steps = _matching(run_dir, _STEP_DIR)
    return [(entry, step) for entry, step in steps if not (entry / COMMITTED).is_file()]


def partial_steps(run_dir: Path) -> list[tuple[Path, int]]:
    """The partial folders (a save in flight, or one whose writer died), with their steps."""
    return _matching(run_dir, _PARTIAL_DIR)


# -- manifests and COMMITTED -------------------------------------------------------------------
def rank_files(folder: Path, rank: int) -> list[Path]:
    """The files of ``folder`` that ``rank``'s manifest lists: its DCP shards (``__<rank>_*``),
    its ``extra-rank<rank>.pt`` and, on rank 0, DCP's ``.metadata``."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file()
        and (
            p.name.startswith(f"__{rank}_")
            or p.name == f"extra-rank{rank}.pt"
            or (rank == 0 and p.name == ".metadata")
        )
    )


def write_manifest(folder: Path, rank: int, threads: int) -> None:
    """Hash ``rank``'s files in ``folder`` and publish ``manifest-rank<rank>.json`` (name ->
    size and xxh3), the last thing this rank does in the folder."""
    mine = rank_files(folder, rank)
    # One thread per file, as many as wrote them: reading back and hashing is then no slower
    # than the write (one thread hashes about 1.5 GB/s of page cache; 4 in parallel, 4x that).
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(mine), threads))) as pool:
        digests = list(pool.map(_digest, mine))
    manifest = {p.name: {"size": p.stat().st_size, "xxh3": d} for p, d in zip(mine, digests, strict=True)}
    publish(folder / f"manifest-rank{rank}.json", json.dumps(manifest, sort_keys=True).encode())


def missing_manifests(folder: Path, world: int) -> list[str]:
    """The manifests of ``world`` ranks not (yet) in ``folder``."""
    names = [f"manifest-rank{r}.json" for r in range(world)]
    return [n for n in names if not (folder / n).is_file()]


def write_committed(folder: Path, *, step: int, world: int, token: str) -> dict[str, Any]:
    """Merge every rank's manifest into ``COMMITTED`` (step, world, the save's token, every
    file), written durably with the folder's names; returns the files it lists."""
    files: dict[str, Any] = {}
    for rank in range(world):
        files.update(json.loads((folder / f"manifest-rank{rank}.json").read_text()))
    write_durable(
        folder / COMMITTED,
        json.dumps({"step": step, "world": world, "token": token, "files": files}, sort_keys=True).encode(),
    )
    return files


def verify(folder: Path, step: int, *, rank: int = 0, world: int = 1) -> str | None:
    """None when the files listed in COMMITTED match (``rank``'s share of them: every
    ``world``-th name from the ``rank``-th; all of them by default) and COMMITTED is for
    ``step``; else what is wrong. A manifest entry holds ``xxh3``, or ``crc32`` when written
    before it."""
    try:
        committed = json.loads((folder / COMMITTED).read_text())
        listed, committed_step = committed["files"], committed["step"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {COMMITTED}: {exc}"
    if committed_step != step:
        return f"{COMMITTED} is for step {committed_step!r}"
    names = sorted(listed)
    for name in names[rank::world]:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != listed[name]["size"]:
            return f"{name} has {path.stat().st_size} bytes, expected {listed[name]['size']}"
        entry = listed[name]
        if ("xxh3" in entry and _digest(path) != entry["xxh3"]) or (
            "xxh3" not in entry and _crc(path) != entry.get("crc32")
        ):
            return f"{name} does not match its manifest's digest"
    return None


# -- moving aside and retention ----------------------------------------------------------------
def move_aside(folder: Path) -> Path:
    """Rename a damaged step folder to ``<name>.rejected-<token>`` (durably), so that it is never
    restored, kept as a commit or counted by retention; returns the new path. Raises the
    ``OSError`` of a volume where it cannot."""
    aside = folder.with_name(f"{folder.name}.rejected-{secrets.token_hex(4)}")
    os.rename(folder, aside)
    fsync_dir(folder.parent)
    return aside


def retain(run_dir: Path, newest: int, keep: int) -> None:
    """``newest`` was just committed (or verified) here: keep it and the ``keep - 1``
    committed checkpoints before it. Newer step folders were not verified by this run, so
    they are neither counted (a damaged one would push out the last good checkpoint) nor
    deleted. Partial and rejected folders older than ``newest`` are removed."""
    older = [step for step in committed_steps(run_dir) if step < newest]
    for step in older[: max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(step_dir(run_dir, step), ignore_errors=True)
    for entry in run_dir.iterdir():
        match = _PARTIAL_DIR.match(entry.name) or _REJECTED_DIR.match(entry.name)
        if match and int(match.group(1)) < newest:
            shutil.rmtree(entry, ignore_errors=True)
