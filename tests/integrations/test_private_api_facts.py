"""The private framework API the integrations use (``nvtrain.integrations.private_api``): the
facts recorded for each end of each supported range are those of that version's own source,
and a framework whose private API differs is refused with a message naming the version, the
change and the range.

The installed frameworks (CI's pins, the high ends) are read where they are installed; each
end's wheel is read from ``$NVTRAIN_FRAMEWORK_WHEELS`` (``scripts/fetch-framework-wheels``
downloads them), and that test skips, saying so, when a wheel is not there.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

import pytest

from nvtrain.integrations import private_api
from nvtrain.integrations.private_api import FRAMEWORKS, HF, Framework

WHEELS = Path(os.environ.get("NVTRAIN_FRAMEWORK_WHEELS", Path.home() / ".cache/nvtrain/framework-wheels"))
IMPORTS = {"transformers": "transformers", "lightning": "lightning", "accelerate": "accelerate"}
ENDS = [(f.distribution, end) for f in FRAMEWORKS.values() for end in (f.low, f.high)]


def _recorded(framework: Framework, version: str) -> dict[tuple[str, str], tuple[str, ...] | None]:
    return {(u.owner, u.name): u.params for u in framework.recorded[version]}


def _found(framework: Framework, sources: dict[str, str | None]) -> dict[tuple[str, str], object]:
    found: dict[tuple[str, str], object] = {}
    for path, text in sources.items():
        assert text is not None, f"{framework.distribution}: {path} is not in its source"
        mine = tuple(u for u in framework.uses() if u.path == path)
        found.update(private_api.facts_in_source(text, mine))
    return found


def _installed_sources(framework: Framework) -> dict[str, str | None]:
    return {path: private_api._installed_source(path) for path in {u.path for u in framework.uses()}}


@pytest.mark.parametrize("distribution", sorted(FRAMEWORKS))
def test_the_installed_version_is_a_recorded_end_with_its_facts(distribution: str) -> None:
    """CI's pin is an end of the range, and what its installed source has is what is recorded
    for it (a new pin needs its facts recorded, and the range moved)."""
    module = pytest.importorskip(IMPORTS[distribution])
    framework = FRAMEWORKS[distribution]
    version = module.__version__
    assert version in framework.recorded, (
        f"{distribution} {version} installed; recorded: {sorted(framework.recorded)}"
    )
    assert _found(framework, _installed_sources(framework)) == _recorded(framework, version)
    private_api.check(distribution, version)  # refuses nothing


@pytest.mark.parametrize(("distribution", "version"), ENDS)
def test_each_ends_wheel_has_the_recorded_facts(distribution: str, version: str) -> None:
    framework = FRAMEWORKS[distribution]
    wheels = sorted(WHEELS.glob(f"{distribution}-{version}-*.whl"))
    if not wheels:
        pytest.skip(f"no {distribution} {version} wheel in {WHEELS}: run bash scripts/fetch-framework-wheels")
    sources = private_api.wheel_sources(framework, wheels[0])
    assert _found(framework, sources) == _recorded(framework, version)
    assert private_api.problems(framework, sources) == []


def _trainer_source() -> str:
    pytest.importorskip("transformers")
    text = private_api._installed_source("transformers/trainer.py")
    assert text is not None
    return text


def test_a_changed_signature_or_a_missing_attribute_is_refused_naming_version_and_range() -> None:
    from nvtrain.integrations.core import Refused

    text = _trainer_source()
    changed = text.replace(
        "def _load_scaler(self, checkpoint:", "def _load_scaler(self, checkpoint, device, _c:"
    )
    changed = changed.replace("self._train_batch_size =", "self._batch_size_now =")
    assert (
        changed.count("_load_scaler(self, checkpoint, device, _c:") == 1
        and "self._train_batch_size =" not in changed
    )
    with pytest.raises(Refused) as raised:
        private_api.check("transformers", "9.1.0", {"transformers/trainer.py": changed})
    message = str(raised.value)
    assert message.startswith("transformers 9.1.0 is not a version nvtrain.integrations.hf can use"), message
    assert (
        "Trainer._load_scaler(self, checkpoint) is now Trainer._load_scaler(self, checkpoint, device, _c)"
        in message
    )
    assert "Trainer._train_batch_size is missing" in message
    assert f"built for transformers {HF.low} to {HF.high}" in message
    assert f"pip install 'transformers>={HF.low},<={HF.high}'" in message


def test_a_version_outside_the_range_with_the_recorded_facts_goes_on_saying_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = _trainer_source()
    with caplog.at_level(logging.WARNING, logger="nvtrain.worker"):
        private_api.check("transformers", "5.99.0", {"transformers/trainer.py": text})
    assert any(
        "transformers 5.99.0 is outside the range nvtrain.integrations.hf was built for" in r.getMessage()
        for r in caplog.records
    ), caplog.text


def test_a_trainer_without_a_replaced_method_is_refused_before_training(tmp_path: Path) -> None:
    """The live Trainer is checked too (a subclass may drop what the class had)."""
    transformers = pytest.importorskip("transformers")
    hf = importlib.import_module("nvtrain.integrations.hf")
    import torch

    from nvtrain.integrations.core import Refused

    class NoScaler(transformers.Trainer):  # type: ignore[misc]
        _load_scaler = None

    model = torch.nn.Linear(2, 2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = NoScaler(model=model, args=args)
    with pytest.raises(Refused, match=r"has no _load_scaler, which nvtrain.integrations.hf uses to resume"):
        hf.train(None, trainer)  # refused before the context is used
