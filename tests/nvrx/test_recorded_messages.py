"""Every parser of NVRx's words on what NVRx 0.4.1, 0.6.0 and 0.7.0 really said.

``tests/nvrx/recorded/<version>/`` (README.md there says how each file was made): the in-process
layer's messages of real 2-rank runs read by ``nvrx.messages`` (``restart_cause``,
``gave_up_reason``), NVRx's own formatting of larger rank sets, and ft_launcher's log lines of
real runs read by ``nvrx.log_grammar``. The expectations restate what each scenario did (rank 1
failed, the limit was 2 attempts, ...), written by hand, so that a parser that reads a version's
form wrongly fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvtrain.nvrx import log_grammar
from nvtrain.nvrx.messages import gave_up_reason, restart_cause

RECORDED = Path(__file__).resolve().parent / "recorded"
VERSIONS = ("0.4.1", "0.6.0", "0.7.0")
LAUNCHER_LOGS = Path(__file__).resolve().parents[1] / "launcher" / "nvrx_logs"
IMPORTS_TORCH = pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning")
"""For the tests that import NVRx's ``RestartAbort``: NVRx's ``inprocess`` imports torch, whose
``torch.cuda`` imports the pynvml shim that warns (as in tests/conftest.py's TORCH_FOLDERS)."""


def said(version: str, scenario: str, rank: int, what: str) -> list[str]:
    """The ``what`` lines (``interruption``, ``fn_exception``, ``gave_up``) rank ``rank`` recorded."""
    path = RECORDED / version / "inprocess" / f"{scenario}.rank{rank}.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.partition(": ")[2] for line in lines if line.startswith(what + ": ")]


def restart_abort(recorded: str) -> BaseException:
    """The ``RestartAbort`` NVRx ended with, from its recorded ``<module>.<class>: <text>``: the
    installed NVRx's class (the same module and name in every version, checked here), the
    recorded text."""
    from nvidia_resiliency_ext.inprocess.exception import RestartAbort

    name, _, text = recorded.partition(": ")
    assert name == f"{RestartAbort.__module__}.{RestartAbort.__qualname__}"
    return RestartAbort(text)


# -- the in-process layer: restart_cause ----------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("scenario", "cause"),
    [("exception", "exception"), ("soft_timeout", "soft timeout"), ("min_world_size", "terminated")],
)
def test_restart_cause_of_a_peers_interruption(version: str, scenario: str, cause: str) -> None:
    # Rank 1 failed; rank 0 was interrupted for it: a peer's fault there, its own on rank 1.
    message = said(version, scenario, 0, "interruption")[0]
    assert restart_cause(None, [message], 0) == (f"peer {cause}", message)
    assert restart_cause(None, [message], 1) == (cause, message)


@pytest.mark.parametrize("version", VERSIONS)
def test_restart_cause_of_the_ranks_own_exception(version: str) -> None:
    # The faulty rank's cause is its exception, with the repr NVRx's state held as the detail.
    fault = ValueError("injected fault of rank 1")
    assert said(version, "exception", 1, "fn_exception") == [repr(fault)]
    assert restart_cause(fault, [], 1) == ("exception (ValueError)", repr(fault))


@pytest.mark.parametrize("version", VERSIONS)
def test_restart_cause_of_every_attempt_given_up(version: str) -> None:
    # max_iterations=2: rank 0 was interrupted by rank 1's exception in both attempts.
    messages = said(version, "max_iterations", 0, "interruption")
    assert len(messages) == 2
    assert {restart_cause(None, [m], 0)[0] for m in messages} == {"peer exception"}


def rank_sets(version: str) -> list[tuple[list[int], str]]:
    """``(ranks given, message)`` of NVRx's formatter (``rank_sets.txt``)."""
    lines = (RECORDED / version / "rank_sets.txt").read_text(encoding="utf-8").splitlines()
    return [
        ([int(r) for r in given.split(",")], message)
        for given, _, message in (line.partition(": ") for line in lines)
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_restart_cause_reads_every_rank_set_form(version: str) -> None:
    # Each form of the set NVRx prints (0.4's repr; 0.6+'s ranges and its first and last four
    # of more than 8): a listed rank is the interrupted one, a rank outside the set a peer, and
    # a rank in the part 0.6+ leaves out is neither (it cannot be told).
    cases = rank_sets(version)
    assert len(cases) == (7 if version == "0.4.1" else 11)
    for given, message in cases:  # the ranks given are those of the first kind named
        kind = "exception" if message.startswith("Interruption.EXCEPTION") else "soft timeout"
        ranks = sorted(given)
        # Past 8 ranks NVRx 0.6+ shows the first and last four: "{0, 1, 2, 3...12, 13, 14, 15 (total: 16)}"
        elided = "..." in message
        for rank in range(ranks[-1] + 2):
            got = restart_cause(None, [message], rank)[0]
            if rank in ranks or (elided and ranks[3] < rank < ranks[-4]):
                assert got == kind, (message, rank)
            else:
                assert got == f"peer {kind}", (message, rank)


# -- the in-process layer: gave_up_reason ---------------------------------------------------------


@IMPORTS_TORCH
@pytest.mark.parametrize("version", VERSIONS)
def test_gave_up_when_max_iterations_ran_out(version: str) -> None:
    for rank in (0, 1):
        (recorded,) = said(version, "max_iterations", rank, "gave_up")
        assert gave_up_reason(restart_abort(recorded)) == "[restart.in_process] max_attempts = 2 used"


@IMPORTS_TORCH
@pytest.mark.parametrize("version", VERSIONS)
def test_gave_up_when_min_world_size_was_undercut(version: str) -> None:
    (recorded,) = said(version, "min_world_size", 0, "gave_up")
    assert (
        gave_up_reason(restart_abort(recorded)) == "1 rank(s) left, [restart.in_process] min_world_size = 2"
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_gave_up_only_for_nvrx_restart_abort(version: str) -> None:
    # The same text in an exception of another class is no reason of NVRx's.
    (recorded,) = said(version, "max_iterations", 0, "gave_up")

    class RestartAbort(Exception):  # noqa: N818 - NVRx's name, in another module
        pass

    assert gave_up_reason(RestartAbort(recorded.partition(": ")[2])) is None
    assert said(version, "exception", 0, "gave_up") == []  # a clean run gives nothing up


# -- ft_launcher's log lines: log_grammar ---------------------------------------------------------

# What each recogniser finds in launcher.txt, in order (the scenarios of record_nvrx_logs.sh one
# after the other; pids left out): ("joined", round, group rank, nodes), ("exit", local rank, exit
# code), ("restart", attempts left, limit), ("hang", rank, local rank, heartbeat), ("error", class).


def _restarted(
    exit_code: int, round_: int | None, hang: tuple[object, ...] | None = None
) -> list[tuple[object, ...]]:
    """One fault of rank 1 and the restart after it (a hang: the monitor's report first)."""
    return [
        ("joined", 0 if round_ is not None else None, 0, 1),
        *([hang] if hang else []),
        ("exit", 1, exit_code),
        ("restart", 3, 3),
        ("joined", round_, 0, 1),
    ]


def expected_acts(version: str) -> list[tuple[object, ...]]:
    old = version == "0.4.1"
    round_ = 1 if old else None
    hang = ("hang", 1, None, "subsequent") if old else ("hang", None, 1, "subsequent")
    exhausted: list[tuple[object, ...]] = [
        ("joined", 0 if old else None, 0, 1),
        ("exit", 1, 3),
        ("restart", 1, 1),
        ("joined", round_, 0, 1),
        ("exit", 1, 3),
    ]
    if old:
        exhausted.append(("exit", 1, 3))  # 0.4.1 logs the last failure twice
    if version == "0.6.0":
        exhausted.append(("error", "AssertionError"))  # 0.6.0 ends on its own assertion
    return [
        ("joined", 0 if old else None, 0, 1),  # success
        *_restarted(3, round_),
        *_restarted(-9, round_),
        *_restarted(-9, round_, hang),  # the monitor kills the hung rank: SIGKILL
        *exhausted,
        ("error", log_grammar.RENDEZVOUS_TIMEOUT),
        ("joined", 0 if old else None, 0, 1),  # sigterm
        ("exit", 0, -15),
        ("error", "SignalException"),
    ]


def acts(line: str) -> list[tuple[object, ...]]:
    """What the recognisers find in ``line``."""
    found: list[tuple[object, ...]] = []
    if (joined := log_grammar.joined(line)) is not None:
        found.append(("joined", joined.round, joined.group_rank, joined.nodes))
    if (failed := log_grammar.worker_exit(line)) is not None:
        found.append(("exit", failed.local_rank, failed.exit_code))
        assert f"(pid: {failed.pid})" in line
    if (restart := log_grammar.restart(line)) is not None:
        found.append(("restart", restart.attempts_left, restart.max_restarts))
    if (hang := log_grammar.hang(line)) is not None:
        assert hang.section is None
        found.append(("hang", hang.rank, hang.local_rank, hang.heartbeat))
    if (error := log_grammar.agent_error(line)) is not None:
        assert error.message.startswith("e=") and line.count(error.message) == 1
        found.append(("error", error.error))
    return found


def launcher_lines(version: str) -> list[str]:
    return (RECORDED / version / "launcher.txt").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("version", VERSIONS)
def test_launcher_lines_recognised(version: str) -> None:
    found = [act for line in launcher_lines(version) for act in acts(line)]
    assert found == expected_acts(version)
    # One recogniser per line: none of the lines is read twice.
    assert all(len(acts(line)) == 1 for line in launcher_lines(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_rendezvous_timeout_message(version: str) -> None:
    # 0.4.1 says e=RendezvousTimeoutError(), 0.6/0.7 give it a message; the class is read alike.
    (line,) = [line for line in launcher_lines(version) if "RendezvousTimeoutError" in line]
    error = log_grammar.agent_error(line)
    assert error is not None and error.error == log_grammar.RENDEZVOUS_TIMEOUT
    assert (error.message == "e=RendezvousTimeoutError()") == (version == "0.4.1")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_line_acted_on_is_a_launcher_record(version: str) -> None:
    # They are the launcher's (its own, its monitors', torch's agent's), with the level they
    # were logged at: a worker's exit and the agent's end are errors, the hang a warning.
    for line in launcher_lines(version):
        record = log_grammar.launcher_record(line)
        assert record is not None, line
        assert record.message in line
        (act,) = acts(line)
        want = {"exit": log_grammar.ERROR_LEVELS, "error": log_grammar.ERROR_LEVELS}.get(str(act[0]))
        if act[0] == "hang":
            want = log_grammar.WARNING_LEVELS
        if want is not None:
            assert record.level in want, line


@pytest.mark.parametrize("version", VERSIONS)
def test_launcher_record_formats(version: str) -> None:
    lines = (RECORDED / version / "records.txt").read_text(encoding="utf-8").splitlines()
    records = [log_grammar.launcher_record(line) for line in lines]
    levels = {record.level for record in records if record is not None}
    if version == "0.4.1":
        assert levels == {"INFO", "WARNING", "ERROR", "ALWAYS"}
    else:  # NVRx's logger and torch's, whose file is named relative to the launcher's folder
        assert levels == {"INFO", "WARNING", "ERROR", "E", "W"}
        assert any(line.startswith("E") and " .venv/" in line for line in lines)
    for line, record in zip(lines, records, strict=True):
        if line.startswith("WORKER "):  # a worker's own line
            assert record is None and not log_grammar.table_row(line)
        elif line.startswith(" "):  # a row of the table of the record before it
            assert record is None and log_grammar.table_row(line)
        else:
            assert record is not None, line
            assert not log_grammar.cancelled_callback(record.message)


@pytest.mark.parametrize("version", VERSIONS)
def test_lines_of_the_gpu_machine_logs(version: str) -> None:
    # The logs of tests/launcher/nvrx_logs/ (0.6/0.7 recorded on the GPU machine, torch's files
    # named torch/distributed/...): every line acted on there is a launcher record too.
    lines = [
        line
        for path in sorted((LAUNCHER_LOGS / version).glob("*.log"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]
    acted = [line for line in lines if acts(line)]
    assert len(acted) >= 20
    assert all(log_grammar.launcher_record(line) is not None for line in acted)
