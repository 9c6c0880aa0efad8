"""``private.unsafe_ancestor`` and ``private.claim_default``: every folder from ``/`` down to
one a run writes into is root's or this user's and not writable by others unless sticky; a
default folder that another user made first gives way to a fresh one of this user's. Real
folders, owners and links (another user's are made by chown, as root)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nvtrain import private

NOBODY = 65534


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")


def test_a_folder_of_another_user_anywhere_above_is_named_with_its_owner_mode_and_fix(tmp_path: Path) -> None:
    _root_only()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: sticky, so it passes itself
    theirs = shared / "nbp"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    run = theirs / "ck" / "run-1"
    found = private.unsafe_ancestor(run.parent, below=run)
    assert found is not None and found.parent and found.path == run
    assert found.reason.startswith(f"is under {theirs} (mode 0755), which belongs to uid 65534 (nobody)")
    assert found.fix.startswith(f"make {theirs} root's or this user's (chown)")
    with pytest.raises(private.NotPrivate, match="belongs to uid 65534"):  # what make_private_dir says
        private.make_private_dir(theirs / "x")
    assert not (theirs / "x").exists()


def test_open_folders_need_the_sticky_bit_and_group_writable_volumes_pass(tmp_path: Path) -> None:
    open_ = tmp_path / "open"
    (open_ / "deep").mkdir(parents=True)
    open_.chmod(0o777)
    found = private.unsafe_ancestor(open_ / "deep", below=open_ / "deep" / "run")
    assert found is not None and f"is under {open_} (mode 0777), which anyone may write" in found.reason
    assert found.fix.startswith(f"give {open_} the sticky bit")
    open_.chmod(0o1777)
    assert private.unsafe_ancestor(open_ / "deep") is None
    volume = tmp_path / "volume"  # Kubernetes' fsGroup: group-writable, setgid
    volume.mkdir()
    volume.chmod(0o2775)
    assert private.unsafe_ancestor(volume) is None
    assert private.unsafe_ancestor(tmp_path / "not" / "made" / "yet") is None


def test_a_link_is_followed_only_when_safe_and_its_target_is_checked_too(tmp_path: Path) -> None:
    _root_only()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    mine = shared / "mine"
    mine.mkdir(mode=0o755)
    # A link of ours to their folder: followed, and their folder refused.
    (mine / "to-theirs").symlink_to(theirs)
    found = private.unsafe_ancestor(mine / "to-theirs" / "ck")
    assert found is not None and f"under {theirs}" in found.reason
    # Their link (in a folder others may write) to a safe folder: not followed.
    (shared / "their-link").symlink_to(mine)
    os.lchown(shared / "their-link", NOBODY, NOBODY)
    found = private.unsafe_ancestor(shared / "their-link" / "ck")
    assert found is not None and "a symbolic link that belongs to uid 65534 (nobody)" in found.reason
    # Our own link to our own folder: fine; ".." after a link goes up from its target, and
    # passing through their folder on the way is refused (they could replace it with a link).
    (shared / "my-link").symlink_to(mine)
    assert private.unsafe_ancestor(shared / "my-link" / "ck") is None
    assert private.unsafe_ancestor(shared / "my-link" / ".." / "mine") is None
    found = private.unsafe_ancestor(mine / "to-theirs" / ".." / "mine")
    assert found is not None and f"under {theirs}" in found.reason


def test_a_default_folder_another_user_made_first_gives_way_to_a_fresh_one(tmp_path: Path) -> None:
    _root_only()
    assert private.claim_default(tmp_path / "nvtrain") == (tmp_path / "nvtrain", None)  # not there yet
    (tmp_path / "nvtrain").mkdir()
    assert private.claim_default(tmp_path / "nvtrain", "ck") == (tmp_path / "nvtrain" / "ck", None)  # ours
    theirs = tmp_path / "demo"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    chosen, note = private.claim_default(theirs, "checkpoints")
    assert re.fullmatch(rf"demo-{os.geteuid()}-[0-9a-f]{{12}}", chosen.parent.name), chosen
    assert chosen.parent.parent == tmp_path and chosen.name == "checkpoints" and not chosen.parent.exists()
    assert note is not None and note.startswith(f"{theirs} belongs to uid 65534 (nobody); this run keeps")
    assert str(chosen) in note
    again, _ = private.claim_default(theirs, "checkpoints")
    assert again != chosen  # unpredictable: no one can make it first
    # Once a run has made its fresh folder, a later run takes the same one (its checkpoints are
    # there), but never one of that name that is another user's.
    decoy = tmp_path / f"demo-{os.geteuid()}-000000000000"
    decoy.mkdir()
    os.chown(decoy, NOBODY, NOBODY)
    chosen.parent.mkdir(mode=0o700)
    later, note = private.claim_default(theirs, "checkpoints")
    assert (
        later == chosen
        and note is not None
        and f"keeps its checkpoints in the folder of this user's, {chosen}" in note
    )
    (tmp_path / "link").symlink_to(tmp_path / "nvtrain")
    chosen, note = private.claim_default(tmp_path / "link")
    assert chosen != tmp_path / "link" and note is not None and "is a symbolic link" in note
