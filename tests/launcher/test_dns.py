"""Pod DNS names and the wait for them, with an injected resolver, clock and sleep (no real time)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, NvtrainError
from nvtrain.launcher.dns import DnsTimeout, pod_name, resolve, wait_until_resolvable

NAME = "llm-train-0.llm-train.default.svc.cluster.local"


def test_pod_name_defaults() -> None:
    policy = Policy.model_validate({"job": {"name": "llm-train", "script": "t.py"}})
    assert pod_name(policy, 0) == NAME
    assert pod_name(policy, 12) == "llm-train-12.llm-train.default.svc.cluster.local"


def test_pod_name_with_service_namespace_and_domain() -> None:
    policy = Policy.model_validate(
        {
            "job": {"name": "llm-train", "script": "t.py"},
            "rendezvous": {"service": "svc-a", "namespace": "research", "cluster_domain": "k8s.example"},
        }
    )
    assert pod_name(policy, 3) == "llm-train-3.svc-a.research.svc.k8s.example"


class FakeTime:
    """A clock that only moves when the code under test sleeps (or a resolver takes time)."""

    def __init__(self, resolve_cost: float = 0.0) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.resolve_cost = resolve_cost

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class Appears:
    """A resolver whose records appear after ``failures`` failed lookups."""

    def __init__(self, failures: int, time: FakeTime, addresses: list[str] | None = None) -> None:
        self.failures = failures
        self.calls: list[str] = []
        self.time = time
        self.addresses = addresses or ["10.0.0.5"]

    def __call__(self, name: str) -> list[str]:
        self.calls.append(name)
        self.time.now += self.time.resolve_cost
        if len(self.calls) <= self.failures:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.addresses


def no_jitter() -> float:
    return 1.0  # every wait its whole step


def waiting(time: FakeTime, timeout: float, resolver: Any, jitter: Any = no_jitter) -> list[str]:
    return wait_until_resolvable(
        NAME, timeout, resolver=resolver, clock=time.clock, sleep=time.sleep, jitter=jitter
    )


def test_records_that_appear_after_some_tries_are_returned() -> None:
    time = FakeTime()
    resolver = Appears(3, time, ["10.0.0.5", "10.0.0.6"])
    retries: list[tuple[float, str]] = []
    found = wait_until_resolvable(
        NAME,
        60,
        resolver=resolver,
        clock=time.clock,
        sleep=time.sleep,
        on_retry=lambda waited, err: retries.append((waited, err)),
        jitter=no_jitter,
    )
    assert found == ["10.0.0.5", "10.0.0.6"]
    assert resolver.calls == [NAME] * 4
    assert time.sleeps == [0.5, 1.0, 2.0]
    assert [w for w, _ in retries] == [0.0, 0.5, 1.5]
    assert {e for _, e in retries} == {"Name or service not known"}


def test_resolvable_at_once_does_not_sleep() -> None:
    time = FakeTime()
    assert wait_until_resolvable(
        NAME, 5, resolver=Appears(0, time), clock=time.clock, sleep=time.sleep, jitter=no_jitter
    )
    assert time.sleeps == []


def test_never_resolving_raises_dns_timeout_with_exit_code_3() -> None:
    time = FakeTime()
    resolver = Appears(10**9, time)
    with pytest.raises(DnsTimeout) as info:
        wait_until_resolvable(
            NAME, 30, resolver=resolver, clock=time.clock, sleep=time.sleep, jitter=no_jitter
        )
    error = info.value
    assert isinstance(error, NvtrainError)
    assert error.exit_code == ExitCode.RENDEZVOUS == 3
    assert error.name == NAME
    assert error.waited == pytest.approx(30)
    text = str(error)
    assert text.startswith(f"{NAME} did not resolve within 30s (Name or service not known)")
    for cause in (
        "headless Service",
        "[rendezvous] service",
        "subdomain",
        "publishNotReadyAddresses",
        "pod 0",
    ):
        assert cause in text
    # It gave up at the deadline: no sleep ran past it, and it did not stop early.
    assert sum(time.sleeps) == pytest.approx(30)


def test_backoff_grows_and_is_capped_at_5_seconds() -> None:
    time = FakeTime()
    with pytest.raises(DnsTimeout):
        wait_until_resolvable(
            NAME, 60, resolver=Appears(10**9, time), clock=time.clock, sleep=time.sleep, jitter=no_jitter
        )
    delays = time.sleeps
    assert delays[:5] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert max(delays) == 5.0
    # non-decreasing, except the last sleep, cut short to end exactly at the deadline
    assert all(a <= b for a, b in zip(delays[:-2], delays[1:-1], strict=True))
    assert delays[-1] <= 5.0


def test_slow_resolver_counts_against_the_deadline() -> None:
    time = FakeTime(resolve_cost=4.0)
    with pytest.raises(DnsTimeout) as info:
        wait_until_resolvable(
            NAME, 10, resolver=Appears(10**9, time), clock=time.clock, sleep=time.sleep, jitter=no_jitter
        )
    assert info.value.waited >= 10
    assert info.value.waited < 10 + 4.0 + 5.0


def test_empty_answer_is_not_success() -> None:
    time = FakeTime()
    with pytest.raises(DnsTimeout, match=r"\(no addresses\)"):
        wait_until_resolvable(
            NAME, 3, resolver=lambda name: [], clock=time.clock, sleep=time.sleep, jitter=no_jitter
        )


def test_real_resolver_on_localhost_and_an_invalid_name() -> None:
    assert "127.0.0.1" in resolve("localhost")
    with pytest.raises(OSError):
        resolve("pod-0.nvtrain-test.invalid")  # RFC 6761: .invalid never resolves


def test_waits_are_jittered_between_half_and_all_of_their_step() -> None:
    """Pods started together spread their retries: each wait is somewhere in [step/2, step)."""
    waits = []
    for draw in (0.0, 0.5, 0.999):
        time = FakeTime()
        with pytest.raises(DnsTimeout):
            waiting(time, 12, Appears(10**9, time), jitter=lambda d=draw: d)
        waits.append(time.sleeps[:4])
    assert waits[0] == [0.25, 0.5, 1.0, 2.0]
    assert waits[1] == [0.375, 0.75, 1.5, 3.0]
    assert all(0.5 * s <= w < s for w, s in zip(waits[2], [0.5, 1.0, 2.0, 4.0], strict=True))
    time = FakeTime()  # the default draws at random: some waits differ from their step
    with pytest.raises(DnsTimeout):
        wait_until_resolvable(NAME, 30, resolver=Appears(10**9, time), clock=time.clock, sleep=time.sleep)
    assert len(set(time.sleeps[4:-1])) > 1
