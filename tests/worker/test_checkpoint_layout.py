"""The on-disk rules of a checkpoint (``nvtrain.worker.checkpoint.layout``), on real files with no
ranks: what a rank's manifest lists, what COMMITTED holds, when a folder verifies (complete,
tampered, truncated, missing, for another step, legacy CRC-32), which folders count as
committed, what is moved aside and what retention deletes. The protocol around these rules
(ranks, the save in flight, restore sources) is tested in test_checkpointer.py and beside it."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(name="layout")
def _layout() -> ModuleType:
    # Imported per test: the package imports torch, whose pynvml warning this folder's conftest
    # ignores for test items only, not at collection.
    from nvtrain.worker.checkpoint import layout

    return layout


# Two ranks' files as torch DCP and the checkpointer name them.
FILES = {
    "__0_0.distcp": b"rank zero shard " * 64,
    "__1_0.distcp": b"rank one shard " * 80,
    ".metadata": b"coordinator metadata",
    "extra-rank0.pt": b"extra state of rank 0",
    "extra-rank1.pt": b"extra state of rank 1",
}


def _write_checkpoint(
    layout: ModuleType, run_dir: Path, step: int, *, world: int = 2, token: str = "ab12cd"
) -> Path:
    """A save of ``step`` as the protocol makes it: every rank's files and manifest in the
    partial folder, COMMITTED, then the rename. Returns the committed folder."""
    partial = layout.partial_dir(run_dir, step, token)
    partial.mkdir(parents=True)
    for name, data in FILES.items():
        (partial / name).write_bytes(data + str(step).encode())
    for rank in range(world):
        layout.write_manifest(partial, rank, threads=2)
    assert layout.missing_manifests(partial, world) == []
    layout.write_committed(partial, step=step, world=world, token=token)
    final = layout.step_dir(run_dir, step)
    partial.rename(final)
    return final


def _committed(layout: ModuleType, folder: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((folder / layout.COMMITTED).read_text())
    return data


# -- names ---------------------------------------------------------------------------------------


def test_names_of_step_and_partial_folders(tmp_path: Path, layout: ModuleType) -> None:
    assert layout.step_dir(tmp_path, 120).name == "step-000120"
    assert layout.partial_dir(tmp_path, 140, "ab12cd").name == "step-000140.partial-ab12cd"
    assert layout.step_dir(tmp_path, 1234567).name == "step-1234567"


def test_only_step_folders_with_committed_count(tmp_path: Path, layout: ModuleType) -> None:
    run_dir = tmp_path / "run"
    assert layout.committed_steps(run_dir) == []  # no folder yet: nothing committed
    for step in (30, 10):
        _write_checkpoint(layout, run_dir, step, token=f"{step:06x}")
    (run_dir / "step-000040").mkdir()  # no COMMITTED
    (run_dir / "step-000050.partial-abcdef").mkdir()
    (layout.partial_dir(run_dir, 50, "abcdef") / layout.COMMITTED).write_text("{}")  # not renamed
    (run_dir / "step-000060.rejected-abcdef").mkdir()
    (run_dir / "step-000070.rejected-abcdef").mkdir()
    (run_dir / "step-000070.rejected-abcdef" / layout.COMMITTED).write_text("{}")
    (run_dir / "step-000080").write_text("a file, not a folder")  # not a commit: moved aside too
    (run_dir / "step-x").mkdir()
    assert layout.committed_steps(run_dir) == [10, 30]
    uncommitted = [(p.name, s) for p, s in layout.uncommitted_steps(run_dir)]
    assert uncommitted == [("step-000040", 40), ("step-000080", 80)]
    assert [(p.name, s) for p, s in layout.partial_steps(run_dir)] == [("step-000050.partial-abcdef", 50)]


def test_a_run_sees_only_its_own_folder(tmp_path: Path, layout: ModuleType) -> None:
    """Checkpoints live under ``<dir>/<run id>/``: another run's commits are not this run's."""
    _write_checkpoint(layout, tmp_path / "run-a", 10)
    _write_checkpoint(layout, tmp_path / "run-b", 20)
    assert layout.committed_steps(tmp_path / "run-a") == [10]
    assert layout.committed_steps(tmp_path / "run-b") == [20]
    assert layout.committed_steps(tmp_path) == []  # the checkpoint directory itself holds none


# -- manifests and COMMITTED ---------------------------------------------------------------------


def test_each_rank_manifest_lists_its_own_files_and_rank_0_the_metadata(
    tmp_path: Path, layout: ModuleType
) -> None:
    folder = tmp_path / "step-000010.partial-ab12cd"
    folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    (folder / "__10_0.distcp").write_bytes(b"rank ten")  # not rank 1's, though it starts alike
    (folder / "subdir").mkdir()
    assert [p.name for p in layout.rank_files(folder, 0)] == [".metadata", "__0_0.distcp", "extra-rank0.pt"]
    assert [p.name for p in layout.rank_files(folder, 1)] == ["__1_0.distcp", "extra-rank1.pt"]
    layout.write_manifest(folder, 1, threads=4)
    manifest = json.loads((folder / "manifest-rank1.json").read_text())
    assert sorted(manifest) == ["__1_0.distcp", "extra-rank1.pt"]
    assert manifest["__1_0.distcp"]["size"] == len(FILES["__1_0.distcp"])
    assert len(manifest["__1_0.distcp"]["xxh3"]) == 16  # xxh3-64 in hex
    assert manifest["__1_0.distcp"]["xxh3"] != manifest["extra-rank1.pt"]["xxh3"]
    assert not list(folder.glob("*.tmp")), "a manifest appears in one rename, no temporary left"
    assert layout.missing_manifests(folder, 3) == ["manifest-rank0.json", "manifest-rank2.json"]


def test_committed_lists_every_rank_file_with_step_world_and_token(
    tmp_path: Path, layout: ModuleType
) -> None:
    folder = _write_checkpoint(layout, tmp_path / "run", 20, token="0123ab")
    committed = _committed(layout, folder)
    assert (committed["step"], committed["world"], committed["token"]) == (20, 2, "0123ab")
    files = committed["files"]
    assert isinstance(files, dict) and sorted(files) == sorted(FILES)
    for rank in (0, 1):
        manifest = json.loads((folder / f"manifest-rank{rank}.json").read_text())
        assert all(files[name] == entry for name, entry in manifest.items())


def test_commit_needs_every_rank_manifest(tmp_path: Path, layout: ModuleType) -> None:
    folder = tmp_path / "step-000010.partial-ab12cd"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"shard")
    layout.write_manifest(folder, 0, threads=1)
    assert layout.missing_manifests(folder, 2) == ["manifest-rank1.json"]
    with pytest.raises(FileNotFoundError):
        layout.write_committed(folder, step=10, world=2, token="ab12cd")
    assert not (folder / layout.COMMITTED).exists()


# -- verification --------------------------------------------------------------------------------


def test_a_complete_checkpoint_verifies_whole_and_in_every_rank_share(
    tmp_path: Path, layout: ModuleType
) -> None:
    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    assert layout.verify(folder, 10) is None
    assert layout.verify(folder, 10, rank=0, world=2) is None
    assert layout.verify(folder, 10, rank=1, world=2) is None


def test_a_tampered_byte_is_found_by_its_digest(tmp_path: Path, layout: ModuleType) -> None:
    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    shard = folder / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[7] ^= 0x01  # same size, one bit differs
    shard.write_bytes(bytes(data))
    assert layout.verify(folder, 10) == "__1_0.distcp does not match its manifest's digest"


def test_a_truncated_or_missing_file_is_named(tmp_path: Path, layout: ModuleType) -> None:
    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    size = (folder / "__0_0.distcp").stat().st_size
    with (folder / "__0_0.distcp").open("r+b") as handle:
        handle.truncate(size - 3)
    assert layout.verify(folder, 10) == f"__0_0.distcp has {size - 3} bytes, expected {size}"
    (folder / "__0_0.distcp").unlink()
    assert layout.verify(folder, 10) == "__0_0.distcp is missing"


def test_each_rank_checks_only_its_share_of_the_files(tmp_path: Path, layout: ModuleType) -> None:
    """The files listed in COMMITTED, sorted by name, are shared out rank by rank: a damaged
    file is found by the rank whose share holds it (the ranks then agree on the problem)."""
    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    names = sorted(FILES)  # .metadata, __0_0, __1_0, extra-rank0, extra-rank1
    damaged = names[1]  # the second name: rank 1's share of two
    (folder / damaged).write_bytes(b"x" * (folder / damaged).stat().st_size)
    assert layout.verify(folder, 10, rank=0, world=2) is None
    assert layout.verify(folder, 10, rank=1, world=2) == f"{damaged} does not match its manifest's digest"
    assert layout.verify(folder, 10) == f"{damaged} does not match its manifest's digest"


def test_committed_for_another_step_or_unreadable_fails(tmp_path: Path, layout: ModuleType) -> None:
    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    assert layout.verify(folder, 20) == "COMMITTED is for step 10"
    (folder / layout.COMMITTED).write_text('{"step": 10}')  # no file list
    assert layout.verify(folder, 10) == "unreadable COMMITTED: 'files'"
    (folder / layout.COMMITTED).write_text("{not json")
    problem = layout.verify(folder, 10)
    assert problem is not None and problem.startswith("unreadable COMMITTED: "), problem
    (folder / layout.COMMITTED).unlink()
    problem = layout.verify(folder, 10)
    assert problem is not None and problem.startswith("unreadable COMMITTED: [Errno 2]"), problem


def test_a_manifest_with_crc32_from_before_xxh3_still_verifies(tmp_path: Path, layout: ModuleType) -> None:
    import zlib

    folder = _write_checkpoint(layout, tmp_path / "run", 10)
    committed = _committed(layout, folder)
    files = committed["files"]
    assert isinstance(files, dict)
    for name in files:
        files[name] = {"size": files[name]["size"], "crc32": zlib.crc32((folder / name).read_bytes())}
    (folder / layout.COMMITTED).write_text(json.dumps(committed))
    assert layout.verify(folder, 10) is None
    (folder / "extra-rank0.pt").write_bytes(b"X" * (folder / "extra-rank0.pt").stat().st_size)
    assert layout.verify(folder, 10) == "extra-rank0.pt does not match its manifest's digest"


# -- moving aside and retention ------------------------------------------------------------------


def test_a_folder_moved_aside_keeps_its_files_and_never_counts_again(
    tmp_path: Path, layout: ModuleType
) -> None:
    run_dir = tmp_path / "run"
    folder = _write_checkpoint(layout, run_dir, 20)
    aside = layout.move_aside(folder)
    assert aside.parent == run_dir and aside.name.startswith("step-000020.rejected-")
    assert not folder.exists() and (aside / "__0_0.distcp").is_file()
    assert layout.committed_steps(run_dir) == []
    # The same step rejected again never overwrites the first one moved aside.
    again = layout.move_aside(_write_checkpoint(layout, run_dir, 20))
    assert again != aside and aside.is_dir() and again.is_dir()


def test_retention_keeps_the_newest_and_the_keep_minus_one_before_it(
    tmp_path: Path, layout: ModuleType
) -> None:
    run_dir = tmp_path / "run"
    for step in (10, 20, 30, 40):
        _write_checkpoint(layout, run_dir, step, token=f"{step:06x}")
    layout.retain(run_dir, 40, keep=2)
    assert layout.committed_steps(run_dir) == [30, 40]
    layout.retain(run_dir, 40, keep=1)
    assert layout.committed_steps(run_dir) == [40]


def test_retention_never_counts_or_deletes_newer_folders(tmp_path: Path, layout: ModuleType) -> None:
    """A newer commit was not verified by this run: counting it could push out the last good
    checkpoint, so it is left alone, as are newer partial and rejected folders."""
    run_dir = tmp_path / "run"
    for step in (10, 20, 50):
        _write_checkpoint(layout, run_dir, step, token=f"{step:06x}")
    newer_partial = layout.partial_dir(run_dir, 60, "abcdef")
    newer_partial.mkdir()
    newer_rejected = run_dir / "step-000070.rejected-abcdef"
    newer_rejected.mkdir()
    layout.retain(run_dir, 20, keep=2)
    assert layout.committed_steps(run_dir) == [10, 20, 50]
    assert newer_partial.is_dir() and newer_rejected.is_dir()


def test_retention_removes_older_partial_and_rejected_folders_only(
    tmp_path: Path, layout: ModuleType
) -> None:
    run_dir = tmp_path / "run"
    _write_checkpoint(layout, run_dir, 30)
    old_partial = layout.partial_dir(run_dir, 20, "abcdef")
    old_partial.mkdir()
    (old_partial / "__0_0.distcp").write_bytes(b"half a shard")
    old_rejected = run_dir / "step-000010.rejected-abcdef"
    old_rejected.mkdir()
    uncommitted = run_dir / "step-000005"  # without COMMITTED: restore moves it aside, not retention
    uncommitted.mkdir()
    same_step_partial = layout.partial_dir(run_dir, 30, "fedcba")
    same_step_partial.mkdir()
    layout.retain(run_dir, 30, keep=3)
    assert not old_partial.exists() and not old_rejected.exists()
    assert uncommitted.is_dir() and same_step_partial.is_dir()
    assert layout.committed_steps(run_dir) == [30]


# -- what is said about a storage error ----------------------------------------------------------


def test_os_error_text_names_the_error_its_code_and_the_path(layout: ModuleType) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/run/step-000010")
    assert layout.os_error_text(full) == "No space left on device (ENOSPC): /ckpt/run/step-000010"
    assert layout.os_error_text(OSError("no errno")) == "no errno"


def test_the_layout_rules_need_no_torch(layout: ModuleType) -> None:
    """What the module's docstring promises: files only, so these rules stay testable (and
    readable) without torch or ranks."""
    import ast

    tree = ast.parse(Path(layout.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in {"torch", "nvtrain"}}, imported
