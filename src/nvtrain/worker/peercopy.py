"""Each rank's host copy also kept on another pod, so that a replaced pod restores from memory.

A pod that is lost whole (its node fails, it is evicted) takes its ``/dev/shm`` and with it the
host copies of its ranks (``hostcopy``). So, in the background after each save, every rank sends
its sealed copy to its *buddy*: the rank with the same local rank on the next pod,
``(rank + ranks per pod) mod world``; and receives the copy of the rank whose buddy it is. The
buddy keeps it as ``peer-rank<r>.{bin,extra,json}`` in its own pod's folder. When a replacement
pod's ranks find no copy of their own, their buddies send the copies back, and the restore loads
them (``origin = "peer"``) instead of reading storage.

The copy travels on a gloo group of its own, one exchange at a time, and in the same order on
every rank: each save's exchange sends a size header first (zero when this rank has no sealed
copy of that save), so the two ends of a pair always agree on what comes next. The group is the
job's own, trusted like its process group. Copies at rest are authenticated with the node's run
key (``hostcopy``), and each node's launcher has its own: a sender checks the copy it sends (its
MAC and hashes, with its key), and whoever stores received bytes seals them again with its own
key (``_Slot.reseal``: the fields as they came, hashes of what arrived). A copy is trusted only
after the rank it belongs to has checked it like its own (run id, rank, world size, step, commit
token, layout, MAC and hashes, ``HostCopy.find``); anything else restores from storage. Without
a key (or a private folder) a rank still takes its part in every exchange, keeping nothing.

Why not NVRx's ``checkpointing.local`` (``CliqueReplicationStrategy``, in NVRx 0.4.1 to 0.7.0)?
Its replication is an ``all_gather`` inside ``save()``, on the training thread, before the
asynchronous part: every save would block training for the transfer. Its checkpoints are its own
format and its own "latest" (an ``all_gather`` over the default group), with no tie to the
commit of the sharded checkpoint on storage, while nvtrain restores a host copy only when it is
the same commit (token) as storage's newest. So the exchange below is nvtrain's own.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nvtrain.events import Event
from nvtrain.events.records import CheckpointReplicated
from nvtrain.worker.hostcopy import FORMAT, HostCopy, Layout, _Slot, check_hashes, verify_mac
from nvtrain.worker.settings import say

__all__ = ["PeerCopies", "buddy_of", "source_of"]

_CHUNK = 256 << 20
"""Bytes per message: a large copy goes in pieces."""

TIMEOUT = datetime.timedelta(seconds=120)
"""How long one message may take before the exchange gives up (a peer that died)."""


def buddy_of(rank: int, world: int, per_pod: int) -> int:
    """The rank that keeps ``rank``'s copy: the same local rank on the next pod."""
    return (rank + per_pod) % world


def source_of(rank: int, world: int, per_pod: int) -> int:
    """The rank whose copy ``rank`` keeps."""
    return (rank - per_pod) % world


def enabled(world: int, per_pod: int) -> bool:
    """Peer copies need two pods or more of the same size."""
    return per_pod > 0 and world > per_pod and world % per_pod == 0


# -- the wire ----------------------------------------------------------------------------------
_Pending = list[tuple[Any, torch.Tensor]]


def _post(group: Any, dst: int, header: bytes, extra: bytes, data: torch.Tensor | None) -> _Pending:
    """Queue the sends of one copy to ``dst``: the sizes, the header, the extra state, the data
    (nothing but zero sizes when ``data`` is None; the receiver takes them in that order).
    Returns what to wait for (the tensors stay referenced until then)."""
    nbytes = 0 if data is None else data.numel()
    sizes = [len(header), len(extra), nbytes] if data is not None else [0, 0, 0]
    meta = torch.tensor(sizes, dtype=torch.int64)
    parts = [meta]
    if data is not None:
        parts += [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (header, extra) if b]
        parts += [data[i : i + _CHUNK] for i in range(0, nbytes, _CHUNK)]
    return [(dist.isend(part, dst, group=group), part) for part in parts]


def _wait(pending: _Pending) -> None:
    for work, _ in pending:
        work.wait()


def _receive_sizes(group: Any, src: int) -> tuple[int, int, int]:
    meta = torch.zeros(3, dtype=torch.int64)
    dist.recv(meta, src, group=group)
    header, extra, nbytes = (int(x) for x in meta.tolist())
    return header, extra, nbytes


def _receive_bytes(group: Any, src: int, size: int) -> bytes:
    if size == 0:
        return b""
    buffer = torch.empty(size, dtype=torch.uint8)
    dist.recv(buffer, src, group=group)
    return bytes(buffer.numpy().tobytes())


def _receive_into(group: Any, src: int, target: torch.Tensor | None, nbytes: int) -> None:
    """Receive ``nbytes`` into ``target`` (a flat uint8 tensor of at least that size), or into
    a scratch buffer that is dropped (no room for it here)."""
    scratch = None if target is not None else torch.empty(min(nbytes, _CHUNK), dtype=torch.uint8)
    for start in range(0, nbytes, _CHUNK):
        size = min(_CHUNK, nbytes - start)
        piece = target[start : start + size] if target is not None else scratch[:size]  # type: ignore[index]
        dist.recv(piece, src, group=group)


def _problem_in(header: bytes) -> str:
    """The ``problem`` a sender put in place of a copy's header (its check failed), or ""."""
    try:
        fields = json.loads(header)
    except ValueError:
        return ""
    problem = fields.get("problem") if isinstance(fields, dict) else None
    return str(problem) if problem else ""


# -- one rank's side ---------------------------------------------------------------------------
class PeerCopies:
    """This rank's end of the peer copies: sends its copy to ``buddy`` after each save, keeps
    ``source``'s, and at a restore sends and receives the copies a replaced pod needs."""

    def __init__(
        self,
        folder: Path,
        *,
        key: bytes | None,
        run_id: str,
        rank: int,
        world: int,
        per_pod: int,
        group: Any,
        emit: Callable[[Event], None],
    ) -> None:
        self.folder = folder
        self.key = key
        """This node's run key; None: keep no copy (no key, or no private folder)."""
        self.run_id = run_id
        self.rank = rank
        self.world = world
        self.per_pod = per_pod
        self.group = group
        self.emit = emit
        self.buddy = buddy_of(rank, world, per_pod)
        self.source = source_of(rank, world, per_pod)
        self.kept = _Slot(folder, f"peer-rank{self.source}", 0)
        """The copy of ``source`` that this rank keeps."""
        self.queue: queue.Queue[tuple[int, str, HostCopy | None, Any] | None] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.pending = 0
        self.lock = threading.Lock()
        self.broken = False
        """An exchange failed: the two ends of a pair may no longer agree on what comes next, so
        this attempt sends no more copies (the next attempt starts afresh)."""
        self.stopped = False
        self.no_room = False
        self.thread: threading.Thread | None = None

    @staticmethod
    def new_group() -> Any:
        """The gloo group the copies travel on (every rank calls it, at the same point)."""
        return dist.new_group(backend="gloo", timeout=TIMEOUT)

    # -- after each save ------------------------------------------------------------------------
    def submit(self, step: int, token: str, host: HostCopy | None, sealed: Any) -> None:
        """Queue the exchange of ``step``'s copy (``sealed``: the (slot, generation) of this
        rank's copy, None when it has none). Every rank submits every save, in order."""
        with self.lock:
            self.pending += 1
            self.idle.clear()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True, name="nvtrain-peer-copy")
                self.thread.start()
        self.queue.put((step, token, host, sealed))

    def drain(self, limit: float) -> bool:
        """Wait up to ``limit`` seconds for the queued exchanges (the run is ending: the peers
        are waiting for this rank's part). True when none is left."""
        return self.idle.wait(limit)

    def stop(self) -> None:
        """This attempt is over (in-process restart): start no further exchange."""
        self.stopped = True
        self.queue.put(None)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            try:
                if not self.stopped and not self.broken:
                    self._exchange(*item)
            except Exception as exc:  # noqa: BLE001 - the copy is only a faster restore
                self.broken = True
                say(f"peer copies are off until the next restart: {exc!r}")
            finally:
                with self.lock:
                    self.pending -= 1
                    if self.pending == 0:
                        self.idle.set()

    def _exchange(self, step: int, token: str, host: HostCopy | None, sealed: Any) -> None:
        t0 = time.monotonic()
        mine = None
        if host is not None and sealed is not None and self.queue.empty():
            # (A later save already waits: its copy supersedes this one, so send none; the other
            # end reads the zero size and stays in step.)
            slot, generation = sealed
            mine = host.sealed(slot, generation, step=step, token=token)
            data = None if mine is None or slot.flat is None else slot.flat[: json.loads(mine[0])["bytes"]]
        else:
            data = None
        try:
            pending = _post(self.group, self.buddy, *(mine or (b"", b"")), data if mine else None)
            received = self._keep(self.source)
            _wait(pending)
        except Exception as exc:  # noqa: BLE001 - a peer that died, a timeout: storage still has it
            self.broken = True
            error = f"{type(exc).__name__}: {exc}"[:300]
            say(
                f"copy of step {step} not exchanged with ranks {self.buddy}/{self.source}: {error}; "
                "peer copies are off until the next restart"
            )
            self.emit(CheckpointReplicated(step=step, to_rank=self.buddy, from_rank=self.source, error=error))
            return
        self.emit(
            CheckpointReplicated(
                step=step,
                to_rank=self.buddy,
                from_rank=self.source,
                sent_bytes=0 if data is None or mine is None else data.numel(),
                received_bytes=received,
                seconds=round(time.monotonic() - t0, 6),
            )
        )

    def _keep(self, source: int) -> int:
        """Receive ``source``'s copy into ``kept`` (bytes received; a zero size keeps the copy
        held before, which a restore checks by its step and token anyway)."""
        header_size, extra_size, nbytes = _receive_sizes(self.group, source)
        if header_size == 0:
            return 0
        header = _receive_bytes(self.group, source, header_size)
        extra = _receive_bytes(self.group, source, extra_size)
        target = None
        if self.key is not None:
            self.kept.drop_header()  # (while the data is rewritten, it is no copy)
            try:
                self.kept.open_bytes(nbytes)
                target = self.kept.flat
            except OSError as exc:
                if not self.no_room:
                    say(f"no room for the peer copy of rank {source} in {self.folder}: {exc}; it is dropped")
                self.no_room = True
        _receive_into(self.group, source, target, nbytes)
        if target is not None and self.key is not None and self._belongs(header, source):
            self.kept.reseal(header, extra, self.key)  # sealed with this node's key
        return header_size + extra_size + nbytes

    def _belongs(self, header: bytes, source: int) -> bool:
        """The header names this run, world size and ``source`` (the rest is checked by the rank
        it belongs to, before it is loaded)."""
        try:
            fields = json.loads(header)
        except ValueError:
            return False
        wanted = {"format": FORMAT, "run_id": self.run_id, "rank": source, "world": self.world}
        return isinstance(fields, dict) and all(fields.get(k) == v for k, v in wanted.items())

    # -- at a restore -----------------------------------------------------------------------
    def holds(self, *, step: int, token: str | None) -> bool:
        """Whether this rank keeps ``source``'s copy of the commit ``token`` of ``step``."""
        header = self.kept.read_header()
        if header is None or token is None or self.key is None or not verify_mac(header, self.key):
            return False
        wanted = {
            "format": FORMAT,
            "run_id": self.run_id,
            "rank": self.source,
            "world": self.world,
            "step": step,
            "token": token,
        }
        return all(header.get(k) == v for k, v in wanted.items()) and self.kept.data.is_file()

    def plan(self, own: bool, kept: bool, group: Any) -> tuple[list[int], str]:
        """Every rank: which ranks lack a copy of their own (and get it from their buddy); or
        why the copies cannot cover them (then every rank reads storage)."""
        flags = torch.tensor([int(own), int(kept)], dtype=torch.int64)
        everyone = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(everyone, flags, group=group)
        needing = [r for r in range(self.world) if not int(everyone[r][0])]
        uncovered = [r for r in needing if not int(everyone[buddy_of(r, self.world, self.per_pod)][1])]
        if uncovered:
            named = ", ".join(map(str, uncovered[:8]))
            return needing, f"rank(s) {named} have no copy of their own and no peer keeps one"
        return needing, ""

    def bring_back(self, needing: list[int], host: HostCopy | None, layout: Layout | None) -> tuple[Any, str]:
        """Send the kept copy to ``source`` when it needs it, and receive this rank's own from
        ``buddy`` when this rank needs it (into a slot of ``host``, mapped at ``layout``).
        Returns (the slot received into or None, why it could not be used)."""
        pending: _Pending = []
        if self.source in needing:
            header, extra, data = self._checked_kept()
            pending = _post(self.group, self.source, header, extra, data)
        slot, why = None, ""
        if self.rank in needing:
            header_size, extra_size, nbytes = _receive_sizes(self.group, self.buddy)
            if header_size == 0:
                _wait(pending)
                return None, f"rank {self.buddy} sent no copy"
            header = _receive_bytes(self.group, self.buddy, header_size)
            extra = _receive_bytes(self.group, self.buddy, extra_size)
            target = None
            refused = _problem_in(header)
            if refused:  # the buddy's check of what it kept failed: it sent only why
                _wait(pending)
                return None, f"the copy rank {self.buddy} kept: {refused}"
            if host is not None and layout is not None and layout.nbytes == nbytes:
                with contextlib.suppress(OSError):
                    slot = host.receiving_slot(layout)
                    target = slot.flat
            if target is None:
                slot = None
                why = f"the copy from rank {self.buddy} does not fit this rank's state or folder"
            _receive_into(self.group, self.buddy, target, nbytes)
            if slot is not None and host is not None and not host.adopt(slot, header, extra):
                slot, why = None, f"the copy from rank {self.buddy} has no usable header"
        _wait(pending)
        return slot, why

    def _checked_kept(self) -> tuple[bytes, bytes, torch.Tensor | None]:
        """(header, extra, data) of the kept copy to send back, once its MAC and hashes verify
        with this node's key; when they do not, only a header saying why (no extra, no data);
        nothing at all when the copy is gone since ``holds``."""
        if self.key is None:  # (``holds`` was false here: the plan sends no rank this way)
            return b"", b"", None
        try:
            header = self.kept.header.read_bytes()
            fields = json.loads(header)
            nbytes = int(fields["bytes"])
            self.kept.open_bytes(nbytes)
            assert self.kept.flat is not None
        except (OSError, ValueError, KeyError, TypeError):
            return b"", b"", None
        if not verify_mac(fields, self.key):
            problem = "its header's MAC does not verify (not this run's copy)"
        else:
            problem = check_hashes(self.kept, fields, nbytes, self.key)
        if problem:
            return json.dumps({"problem": problem}).encode(), b"", torch.empty(0, dtype=torch.uint8)
        try:
            extra = self.kept.extra.read_bytes()
        except OSError:
            return b"", b"", None
        return header, extra, self.kept.flat[:nbytes]
