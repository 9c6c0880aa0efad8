"""``nvtrain run`` as a drop-in for torchrun, through ``--dry-run``: the script form, torchrun's
flags as policy overrides, the free port of a one-node job, ft_launcher's log options.

Real runs of the same command lines: tests/launcher/test_run_torchrun_style.py.
"""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.launcher.overrides import resolve_run

runner = CliRunner()

POLICY = """\
[job]
name = "flags"
script = "policy_script.py"
args = ["--from-policy"]
nproc_per_node = 2

[rendezvous]
join_timeout = "77s"
{rendezvous}

[restart.in_job]
max_restarts = 1

[checkpoint]
dir = "{ckpt}"
{extra}
"""


def _policy(tmp_path: Path, rendezvous: str = "", extra: str = "", name: str = "p.toml") -> Path:
    path = tmp_path / name
    text = POLICY.format(rendezvous=rendezvous, extra=extra, ckpt=tmp_path / "ckpt")
    path.write_text(text, encoding="utf-8")
    return path


def _script(tmp_path: Path, name: str = "train.py", text: str = "print('hello')\n") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["run", *args], env=env)


def _plan(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _run("--dry-run", *args, env=env)
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def _option(plan: dict[str, Any], name: str) -> str:
    values = [a.split("=", 1)[1] for a in plan["argv"] if a.startswith(f"{name}=")]
    assert len(values) == 1, plan["argv"]
    return values[0]


def _port(plan: dict[str, Any]) -> int:
    return int(plan["endpoint"].rpartition(":")[2])


def _tail(plan: dict[str, Any], first: str) -> list[str]:
    """The entrypoint and its arguments: ``argv`` from ``first`` on."""
    argv: list[str] = plan["argv"]
    return argv[argv.index(first) :]


def _kernel_pick(port: int) -> bool:
    """Whether ``port`` lies in the range the kernel picks from for port 0."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return low <= port <= high


def _fails(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output


# ---------------------------------------------------------------------------------------------
# nvtrain run train.py ARGS: the script form


def test_everything_after_the_script_goes_to_it_verbatim(tmp_path: Path) -> None:
    script = _script(tmp_path)
    args = ["--steps", "3", "--foo", "bar", "-v", "--dry-run", "--nnodes", "4", "--", "x", "--"]
    plan = _plan("--nproc-per-node", "2", str(script), *args)  # --dry-run here is nvtrain's
    assert _tail(plan, str(script)) == [str(script), *args]
    assert _option(plan, "--nproc-per-node") == "2"
    assert _option(plan, "--nnodes") == "1:1"  # the --nnodes 4 after the script is the script's


def test_the_script_form_policy_is_one_node_one_worker_named_after_the_script(tmp_path: Path) -> None:
    script = _script(tmp_path, "My_Train.py")
    plan = _plan(str(script))
    assert _option(plan, "--nproc-per-node") == "1"
    assert _option(plan, "--nnodes") == "1:1"
    assert _option(plan, "--max-restarts") == "5"  # nvtrain's default budget, not torchrun's 0
    assert _option(plan, "--rdzv-id").startswith("my-train-")
    assert plan["is_host"] is True and plan["wait_for"] is None
    run_dir = Path(plan["env"]["NVTRAIN_EVENTS"]).parent
    assert run_dir.parent == Path(tempfile.gettempdir()).resolve() / "nvtrain"
    assert _tail(plan, str(script)) == [str(script)]


def test_a_relative_script_path_is_resolved_where_nvtrain_run_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As `python train.py` gives the script an absolute __file__ (the worker sees it: the
    # process test test_run_low_items.py).
    script = _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _tail(_plan("train.py", "--lr", "1"), str(script)) == [str(script), "--lr", "1"]
    (tmp_path / "sub").mkdir()
    assert _tail(_plan("./sub/../train.py"), str(script)) == [str(script)]  # shown normalised


def test_module_form(tmp_path: Path) -> None:
    plan = _plan("--max_restarts", "0", "-m", "mypkg.train_gpt", "--lr", "3", "-m", "x")
    assert _tail(plan, "mypkg.train_gpt") == ["mypkg.train_gpt", "--lr", "3", "-m", "x"]
    assert plan["argv"][plan["argv"].index("mypkg.train_gpt") - 1] == "-m"
    assert _option(plan, "--rdzv-id").startswith("train-gpt-")
    assert _option(plan, "--max-restarts") == "0"
    assert _plan("--module=pkg.mod", "a")["argv"][-3:] == ["-m", "pkg.mod", "a"]


def test_a_python_file_is_never_read_as_a_policy(tmp_path: Path) -> None:
    script = _script(tmp_path, text="import os\nx = [1,\n")  # not TOML (nor valid Python)
    plan = _plan(str(script))
    assert _tail(plan, str(script)) == [str(script)]
    missing = _run("--dry-run", str(tmp_path / "nope.py"), "--x")
    _fails(missing, "nope.py", "not found")
    assert "TOML" not in missing.output


def test_a_file_with_a_python_shebang_is_a_script(tmp_path: Path) -> None:
    script = _script(tmp_path, "trainer", "#!/usr/bin/env python3\nprint(1)\n")
    assert _tail(_plan(str(script), "--a"), str(script)) == [str(script), "--a"]


def test_a_policy_with_the_script_named_after_it(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "port = 29611")
    script = _script(tmp_path)
    plan = _plan("--policy", str(policy), str(script), "--x", "1")
    assert _tail(plan, str(script)) == [str(script), "--x", "1"]  # the policy's args replaced
    assert "policy_script.py" not in plan["argv"]
    assert _option(plan, "--rdzv-id").startswith("flags-")  # the policy's other keys stay
    assert _option(plan, "--nproc-per-node") == "2"
    assert _port(plan) == 29611
    # After --policy any name is the script, .py or not.
    other = _script(tmp_path, "run_me")
    assert _tail(_plan("--policy", str(policy), str(other)), str(other)) == [str(other)]


def test_a_module_after_a_policy_positional_is_refused(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    _fails(_run("--dry-run", str(policy), "-m", "pkg"), "--policy")


# ---------------------------------------------------------------------------------------------
# nvtrain run POLICY: as before


def test_the_policy_form_keeps_options_after_the_policy_and_args_after_double_dash(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    result = _run(str(policy), "--dry-run", "--run-id", "pol-1", "--", "--lr", "0.5")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert _option(plan, "--rdzv-id") == "pol-1"
    script = str(Path.cwd() / "policy_script.py")  # [job] script, resolved where nvtrain run started
    assert _tail(plan, script) == [script, "--from-policy", "--lr", "0.5"]


def test_rdzv_id_is_the_run_id(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    assert _option(_plan("--rdzv_id", "r-9", str(policy)), "--rdzv-id") == "r-9"
    assert _option(_plan("--rdzv-id=r-8", str(policy)), "--rdzv-id") == "r-8"


# ---------------------------------------------------------------------------------------------
# The rendezvous port


def test_a_one_node_policy_without_a_port_gets_a_free_one(tmp_path: Path) -> None:
    port = _port(_plan(str(_policy(tmp_path))))
    assert port != 29500 and _kernel_pick(port), port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # free (the dry run bound nothing)


def test_an_explicit_port_is_kept_even_29500(tmp_path: Path) -> None:
    assert _port(_plan(str(_policy(tmp_path, "port = 29500")))) == 29500
    assert _port(_plan(str(_policy(tmp_path, "port = 29612")))) == 29612


def test_the_demo_gets_a_free_port_so_two_demos_run_side_by_side() -> None:
    assert _port(_plan()) != 29500  # the built-in demo policy writes no port: one node, a free one


def test_a_derived_port_is_not_a_written_one(tmp_path: Path) -> None:
    # [metrics] port = 29500 moves the default rendezvous port to 29501 (a derived default): a
    # one-node job still gets a free port, a multi-node job the derived one.
    metrics = "[metrics]\nenabled = true\nport = 29500\n"
    port = _port(_plan(str(_policy(tmp_path, extra=metrics))))
    assert port not in (29500, 29501) and _kernel_pick(port), port
    env = {"JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "mn-2"}
    assert _port(_plan(str(_policy(tmp_path, "nodes = 2", extra=metrics)), env=env)) == 29501


def test_keys_derived_from_the_file_follow_the_flags(tmp_path: Path) -> None:
    # With nproc_per_node = "cpu" (gloo), collective_timeout is derived below the in-process
    # soft timeout; with --nproc-per-node 2 (NCCL by default) the plain default applies again.
    text = '[job]\nname = "d"\nscript = "x.py"\nnproc_per_node = "cpu"\n[heartbeat]\ntimeout = "10s"\n'
    path = tmp_path / "d.toml"
    path.write_text(text + f'[checkpoint]\ndir = "{tmp_path}"\n', encoding="utf-8")
    as_written = resolve_run(target=str(path)).policy
    assert as_written.job.collective_timeout < 10 and "job.collective_timeout" in as_written.derived
    overridden = resolve_run(target=str(path), nproc_per_node="2").policy
    assert overridden.job.collective_timeout == 600 and "job.collective_timeout" not in overridden.derived
    assert overridden.heartbeat.timeout == 10  # written keys stay


def test_a_multi_node_job_keeps_29500_by_default(tmp_path: Path) -> None:
    env = {"JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "mn-1"}
    plan = _plan(str(_policy(tmp_path, "nodes = 2")), env=env)
    assert _port(plan) == 29500 and _option(plan, "--nnodes") == "2:2"
    plan = _plan("--nnodes", "2", str(_policy(tmp_path)), env=env)  # multi-node by the flag
    assert _port(plan) == 29500


def test_standalone_makes_one_node_on_a_free_port(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "nodes = 3\nmin_nodes = 2\nport = 29613")
    plan = _plan("--standalone", str(policy))
    assert _option(plan, "--nnodes") == "1:1"
    assert _port(plan) != 29613 and _kernel_pick(_port(plan))
    assert _port(_plan("--standalone", "--master-port", "29614", str(policy))) == 29614


def test_master_port_sets_the_port(tmp_path: Path) -> None:
    script = _script(tmp_path)
    assert _port(_plan("--master_port", "29615", str(script))) == 29615
    assert _port(_plan("--master-port=29616", str(_policy(tmp_path, "port = 29617")))) == 29616


# ---------------------------------------------------------------------------------------------
# torchrun's flags override the policy, and are checked as the file is


def test_flags_beat_the_file_and_leave_the_rest(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    plan = _plan("--nproc_per_node", "gpu", "--nnodes", "2:4", "--max-restarts", "7", str(policy), env={
        "JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "ov-1"
    })  # fmt: skip
    assert _option(plan, "--nproc-per-node") == "gpu"
    assert _option(plan, "--nnodes") == "2:4"
    assert _option(plan, "--max-restarts") == "7"
    assert "join_timeout=77" in _option(plan, "--rdzv-conf")


@pytest.mark.parametrize("value", ["1", "8", "gpu", "cpu"])
def test_nproc_per_node_values(tmp_path: Path, value: str) -> None:
    assert _option(_plan("--nproc-per-node", value, str(_script(tmp_path))), "--nproc-per-node") == value


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--nproc-per-node", "0"], ["--nproc-per-node 0 (command line)", "[job] nproc_per_node", ">= 1"]),
        (["--nproc-per-node", "auto"], ["--nproc-per-node 'auto'", "gpu"]),
        (["--nproc_per_node", "2000"], ["--nproc-per-node 2000", "<= 1024"]),
        (["--nnodes", "two"], ["--nnodes 'two'", "MIN:MAX"]),
        (["--nnodes", "3:2"], ["--nnodes 3:2 (command line)", "[rendezvous] min_nodes"]),
        (["--nnodes", "0"], ["--nnodes 0 (command line)", "[rendezvous] nodes"]),
        (["--max-restarts", "-1"], ["--max-restarts -1 (command line)", "[restart.in_job] max_restarts"]),
        (["--max-restarts", "x"], ["--max-restarts"]),
        (["--master-port", "70000"], ["--master-port 70000 (command line)", "[rendezvous] port"]),
        (["--standalone", "--nnodes", "2"], ["--standalone", "--nnodes"]),
        (["--tee", "5"], ["--tee '5'", "0:3,1:2"]),
        (["-r", "0:9"], ["--redirects '0:9'"]),
        (["--local-ranks-filter", "a"], ["--local-ranks-filter 'a'"]),
    ],
)
def test_a_bad_flag_is_exit_2_naming_it(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    _fails(_run("--dry-run", "--run-id", "bad-1", *args, str(_script(tmp_path))), *needles)


def test_a_finding_on_a_key_no_flag_set_names_the_file_and_the_flags(tmp_path: Path) -> None:
    # The metrics port may not be the rendezvous port: the flag moved the rendezvous port onto it.
    policy = _policy(tmp_path, extra="[metrics]\nenabled = true\nport = 29618\n")
    result = _run("--dry-run", "--master-port", "29618", "--max-restarts", "2", str(policy))
    _fails(result, f"{policy} with --master-port 29618, --max-restarts 2", "[metrics] port")


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        ("--rdzv-backend=etcd", "etcd is not supported"),
        ("--rdzv_conf", "join_timeout"),
        ("--monitor-interval", "[heartbeat] monitor_interval"),
        ("--monitor_interval=1", "wakes at once"),
        ("--ft-cfg-path", "[heartbeat]"),
        ("--ft-rank-heartbeat-timeout", "[heartbeat] timeout"),
        ("--ft_initial_rank_heartbeat_timeout=5", "[heartbeat] initial_timeout"),
        ("--ft-restart-policy", "[restart.in_job] policy"),
        ("--ft-log-level", "[heartbeat] table"),
        ("--no-python", "Python scripts"),
        ("--run-path", "python SCRIPT"),
        ("--start-method", "warm"),
        ("--role", "default role"),
        ("--logs_specs", "--tee"),
    ],
)
def test_torchrun_options_nvtrain_does_not_take_say_what_to_do(tmp_path: Path, flag: str, hint: str) -> None:
    _fails(_run("--dry-run", flag, "x", str(_script(tmp_path))), hint)


# ---------------------------------------------------------------------------------------------
# Options passed on to ft_launcher


def test_log_options_go_to_ft_launcher_before_the_entrypoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    plan = _plan(
        "-t", "3", "--redirects", "0:1,1:2", "--log_dir", "logs", "--local-ranks-filter", "0,1", "train.py"
    )
    assert _tail(plan, "--tee=3") == [
        "--tee=3",
        "--redirects=0:1,1:2",
        f"--log-dir={tmp_path / 'logs'}",
        "--local-ranks-filter=0,1",
        "-m",
        "nvtrain.zygote.client",  # a plain torchrun script starts warm too
        str(tmp_path / "train.py"),
    ]
    plan = _plan("--tee=2", "-r3", "--log-dir", str(tmp_path / "l"), "--no-warm-start", "train.py")
    assert _tail(plan, "--tee=2") == [
        "--tee=2",
        "--redirects=3",
        f"--log-dir={tmp_path / 'l'}",
        "-m",
        "nvtrain.entry",
        str(tmp_path / "train.py"),
    ]


def test_a_plain_script_starts_warm_by_default_and_opts_out_by_key_or_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    warm = _plan("--nproc-per-node", "2", "train.py", "--lr", "1")
    # train.py does not use nvtrain.worker: the server imports torch only (--plain)
    assert warm["zygote"] is not None and "--plain" in warm["zygote"]
    train = str(tmp_path / "train.py")
    assert warm["argv"][-4:] == ["nvtrain.zygote.client", train, "--lr", "1"]
    policy = tmp_path / "cold.toml"
    policy.write_text('[job]\nname = "w"\nscript = "train.py"\nwarm_start = false\n', encoding="utf-8")
    cold = _plan("--policy", str(policy), "--nproc-per-node", "2", "train.py", "--lr", "1")
    assert cold["zygote"] is None
    assert cold["argv"][-5:] == ["-m", "nvtrain.entry", train, "--lr", "1"]
    off = _plan("--nproc-per-node", "2", "--no-warm-start", "train.py", "--no-warm-start")
    assert off["zygote"] is None
    # nvtrain's flag before the script; the same word after it is the script's
    assert off["argv"][-4:] == ["-m", "nvtrain.entry", train, "--no-warm-start"]


def test_verbose_is_nvtrains_before_the_script_and_the_scripts_after(tmp_path: Path) -> None:
    script = _script(tmp_path)
    plan = _plan("-v", str(script), "-v")
    assert _tail(plan, str(script)) == [str(script), "-v"]
    assert "-v" not in plan["argv"][: plan["argv"].index(str(script))]


def test_help_lists_the_forms_and_the_torchrun_flags() -> None:
    result = _run("--help")
    assert result.exit_code == 0
    text = result.stdout
    for option in (
        "--policy", "-m, --module", "--nproc-per-node, --nproc_per_node", "--nnodes",
        "--max-restarts, --max_restarts", "--standalone", "--master-port, --master_port",
        "-t, --tee", "-r, --redirects", "--log-dir, --log_dir",
        "--local-ranks-filter, --local_ranks_filter", "-v, --verbose", "--rdzv-id",
    ):  # fmt: skip
        assert option in text, option
    assert "nvtrain run [OPTIONS] train.py [ARGS]" in text
    assert "$TMPDIR/nvtrain/<run id>/" in text
