"""NVRx versions: parsing, the behaviour each release line has, and the installed version."""

from __future__ import annotations

from importlib import metadata

import pytest

from nvtrain.config import validate_source
from nvtrain.nvrx import NO_RESTART_EXIT_CODE, TESTED, NvrxVersion, installed_nvrx


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.4.1", (0, 4, 1)),
        ("0.6.0", (0, 6, 0)),
        ("0.7.0", (0, 7, 0)),
        ("0.7", (0, 7, 0)),
        ("v0.7.2", (0, 7, 2)),
        ("  0.4.1  ", (0, 4, 1)),
        ("0.6.0rc1", (0, 6, 0)),
        ("0.4.1.post2", (0, 4, 1)),
        ("0.8.0.dev0+cu12", (0, 8, 0)),
        ("1.10.3", (1, 10, 3)),
    ],
)
def test_parse(text: str, parsed: tuple[int, int, int]) -> None:
    version = NvrxVersion.parse(text)
    assert (version.major, version.minor, version.patch) == parsed
    assert version == NvrxVersion(*parsed)


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "latest", "0", "7", "0.x", "x.4.1", ".4.1", "0..4", "v", "-0.4"]
)
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError) as info:
        NvrxVersion.parse(text)
    assert str(info.value) == f"{text!r} is not an NVRx version such as 0.4.1 or 0.7.0"


def test_str_and_line() -> None:
    v = NvrxVersion.parse("0.7")
    assert str(v) == "0.7.0"
    assert v.line == "0.7"
    assert str(NvrxVersion.parse("0.4.1")) == "0.4.1"


def test_ordering() -> None:
    versions = [NvrxVersion.parse(t) for t in ("0.7.0", "0.4.1", "0.10.0", "0.6.0", "0.4.0")]
    assert [str(v) for v in sorted(versions)] == ["0.4.0", "0.4.1", "0.6.0", "0.7.0", "0.10.0"]


@pytest.mark.parametrize(
    ("text", "tested", "barrier", "min_healthy", "inprocess_deprecated", "no_restart_exit_code"),
    [
        ("0.4.1", True, False, True, False, False),
        ("0.5.0", False, False, True, False, False),
        ("0.6.0", True, True, False, True, False),
        ("0.7.0", True, True, False, True, True),
        ("0.8.0", False, True, False, True, True),
        ("1.0.0", False, True, False, True, True),
    ],
)
def test_properties(
    text: str,
    tested: bool,
    barrier: bool,
    min_healthy: bool,
    inprocess_deprecated: bool,
    no_restart_exit_code: bool,
) -> None:
    v = NvrxVersion.parse(text)
    assert v.tested is tested
    assert v.barrier_rendezvous is barrier
    assert v.supports_min_healthy is min_healthy
    assert v.inprocess_deprecated is inprocess_deprecated
    assert v.has_no_restart_exit_code is no_restart_exit_code


@pytest.mark.parametrize(
    ("text", "code", "no_restart"),
    [
        ("0.7.0", 93, True),
        ("0.8.1", 93, True),
        ("0.7.0", 1, False),
        ("0.7.0", 0, False),
        ("0.7.0", -93, False),
        ("0.6.0", 93, False),  # before 0.7, 93 is just a number
        ("0.4.1", 93, False),
    ],
)
def test_no_restart_exit(text: str, code: int, no_restart: bool) -> None:
    assert NO_RESTART_EXIT_CODE == 93
    assert NvrxVersion.parse(text).is_no_restart_exit(code) is no_restart


def test_tested_lines() -> None:
    assert TESTED == ("0.4", "0.6", "0.7")


def test_installed_version_is_read_from_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def version(name: str) -> str:
        asked.append(name)
        return "0.7.1"

    monkeypatch.setattr(metadata, "version", version)
    assert installed_nvrx() == NvrxVersion(0, 7, 1)
    assert asked == ["nvidia-resiliency-ext"]


def test_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    assert installed_nvrx() is None


def test_unparseable_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "unknown")
    assert installed_nvrx() is None


POLICY = '[job]\nname = "x"\nscript = "t.py"\n'


def test_validation_without_nvrx_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    result = validate_source(POLICY, "p.toml")
    assert result.nvrx is None
    assert result.ok
    assert [(f.severity, f.code, f.file, f.line) for f in result.findings] == [
        ("info", "nvrx-missing", "p.toml", None)
    ]
    assert "--nvrx" in result.findings[0].fix


def test_validation_uses_the_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "0.7.0")
    result = validate_source(POLICY, "p.toml")
    assert result.nvrx == NvrxVersion(0, 7, 0)
    assert [f.code for f in result.findings] == ["nvrx-inprocess"]


def test_validation_with_nvrx_none_skips_version_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: pytest.fail("must not be asked"))
    text = POLICY + '[rendezvous]\nnodes = 2\nmin_nodes = 1\n[restart.in_job]\npolicy = "min-healthy"\n'
    result = validate_source(text, "p.toml", nvrx=None)
    assert result.nvrx is None
    assert result.findings == []
    assert result.ok
