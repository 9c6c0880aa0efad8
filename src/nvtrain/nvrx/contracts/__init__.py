"""What nvtrain relies on in each supported NVRx release, recorded as facts (``table``), and
the checks of a contract: against a release's source without importing it (``source``; CI runs
it on the real wheels) and against the imported modules (``live``; ``nvrx.ftmain`` runs it
before it patches). ``docs/nvrx.md`` tells the whole story.
"""

from __future__ import annotations

from nvtrain.nvrx.contracts.facts import SPEEDUPS, Fact
from nvtrain.nvrx.contracts.table import CONTRACTS, Contract
from nvtrain.nvrx.versions import NvrxVersion

__all__ = ["CONTRACTS", "SPEEDUPS", "Contract", "Fact", "contract_for"]


def contract_for(version: NvrxVersion | None) -> Contract | None:
    """The contract of ``version``'s release line, None for an untested one (or no NVRx)."""
    return None if version is None else CONTRACTS.get(version.line)
