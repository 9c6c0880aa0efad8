"""``nvtrain run POLICY --steps 100``: the script's options after a policy file need ``--``; the
error says so, with the command line that works, instead of suggesting one of nvtrain's options."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nvtrain.cli import app

runner = CliRunner()


def test_a_script_option_after_a_policy_points_to_the_dashes(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[job]\nname = "x"\nscript = "train.py"\n', encoding="utf-8")
    result = runner.invoke(app, ["run", str(policy), "--steps", "100"])
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert f"Arguments for the training script go after --: nvtrain run {policy} -- --steps 100" in text
    assert "--master_port" not in text


def test_an_unknown_option_without_a_policy_keeps_the_usual_message() -> None:
    result = runner.invoke(app, ["run", "--bogus", "train.py"])
    assert result.exit_code == 2
    assert "No such option: --bogus" in result.stderr
    assert "go after --" not in result.stderr
