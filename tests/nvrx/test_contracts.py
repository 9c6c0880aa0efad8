"""Each supported NVRx release's contract (``nvtrain.nvrx.contracts``) against its real source.

0.4.1 is the one installed here; 0.6.0 and 0.7.0 are read straight out of their wheels (0.7's
does not install on the CI machine), found in ``$NVTRAIN_NVRX_WHEELS`` (``.ci/run`` downloads
them there and sets it: then a missing wheel fails the test rather than skipping it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from nvtrain.nvrx import contracts
from nvtrain.nvrx.contracts.facts import Calls, Name, Signature
from nvtrain.nvrx.contracts.source import broken_facts

WHEELS_ENV = "NVTRAIN_NVRX_WHEELS"
WHEELS = os.environ.get(WHEELS_ENV, "").strip()
"""Read at import: the tests' environment is cleared of NVTRAIN_* variables (tests/conftest.py)."""
PACKAGE = "nvidia_resiliency_ext"


def _installed_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)  # a namespace package: no __file__
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).parent


def _wheel(version: str) -> Path:
    folder = WHEELS
    if not folder:
        pytest.skip(f"${WHEELS_ENV} is not set (the folder with NVRx {version}'s wheel; .ci/run sets it)")
    found = sorted(Path(folder).glob(f"nvidia_resiliency_ext-{version}-*.whl"))
    if not found:
        pytest.fail(f"no wheel of NVRx {version} in ${WHEELS_ENV}={folder}", pytrace=False)
    return found[0]


def _source(version: str) -> Path:
    """The release's source: the installed package (0.4.1) or its wheel."""
    return _installed_root() if version == "0.4.1" else _wheel(version)


def _copy(version: str, to: Path) -> Path:
    """A writable copy of the release's ``.py`` files under ``to``."""
    source = _source(version)
    if source.is_dir():
        shutil.copytree(source / PACKAGE, to / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    else:
        with zipfile.ZipFile(source) as wheel:
            names = [n for n in wheel.namelist() if n.startswith(PACKAGE + "/") and n.endswith(".py")]
            wheel.extractall(to, names)
    return to


VERSIONS = [contract.version for contract in contracts.CONTRACTS.values()]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_contract_holds_on_its_release(version: str) -> None:
    contract = next(c for c in contracts.CONTRACTS.values() if c.version == version)
    assert broken_facts(contract.facts, _source(version)) == []


def test_a_contract_is_not_met_by_another_release() -> None:
    # 0.4.1 lacks what nvtrain relies on in 0.7 (the barrier rendezvous, the hang-protection switch).
    broken = broken_facts(contracts.CONTRACTS["0.7"].facts, _installed_root())
    assert any("_RendezvousBarrierState._wait_for_rendezvous_open" in why for why in broken)
    assert any("CallWrapper._disable_hang_protection is missing" in why for why in broken)


def _facts_to_rename(version: str) -> list[tuple[object, str]]:
    """One fact of each kind nvtrain relies on, with the word that a rename breaks."""
    contract = next(c for c in contracts.CONTRACTS.values() if c.version == version)
    picks = []
    for kind in (Name, Signature, Calls):
        fact = next(f for f in contract.facts if isinstance(f, kind) and "." in f.path)
        picks.append((fact, fact.path.rpartition(".")[2]))
    return picks


@pytest.mark.parametrize("version", VERSIONS)
def test_a_renamed_name_breaks_the_contract_naming_the_fact(version: str, tmp_path: Path) -> None:
    contract = next(c for c in contracts.CONTRACTS.values() if c.version == version)
    root = _copy(version, tmp_path)
    assert broken_facts(contract.facts, root) == []
    for fact, word in _facts_to_rename(version):
        path = root / (fact.module.replace(".", "/") + ".py")
        subprocess.run(["sed", "-i", f"s/\\b{word}\\b/{word}_renamed/g", str(path)], check=True)
        broken = broken_facts(contract.facts, root)
        assert any(why.startswith(f"{fact}: ") for why in broken), (fact, broken)
        subprocess.run(["sed", "-i", f"s/\\b{word}_renamed\\b/{word}/g", str(path)], check=True)
    # A message format nvtrain parses, reworded.
    init = root / PACKAGE / "inprocess" / "initialize.py"
    subprocess.run(["sed", "-i", "s/self.min_world_size=/self.min_size=/", str(init)], check=True)
    broken = broken_facts(contract.facts, root)
    assert [why for why in broken if "min_world_size" in why] == [
        f"{PACKAGE}.inprocess.initialize contains '{{state.world_size=}} {{self.min_world_size=}}' "
        "(nvrx.messages' parsers): the text is not in it"
    ]
