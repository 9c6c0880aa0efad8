"""Kubernetes pods emulated with Linux network namespaces, for multi-node tests of ``nvtrain run``.

One ``Cluster`` is a bridge in the root namespace (the "cluster network", a private /24 whose
``.1`` is the DNS server's address), a real dnsmasq bound to that address only, and one network
namespace per pod (``nvt-<tag>-<index>``, a veth ``eth0`` to the bridge, its own address). A pod
emulates what the kubelet gives a pod of an Indexed Job with a headless Service:

- its own UTS namespace with hostname ``<job>-<i>`` and an ``/etc/hosts`` that maps that
  hostname (and the pod's stable DNS name) to the pod IP, so ``socket.gethostname()`` resolves
  to the pod address (gloo picks its interface that way);
- ``/etc/resolv.conf`` pointing at the cluster's dnsmasq (``ip netns exec`` bind-mounts the
  files in ``/etc/netns/<ns>/`` over ``/etc``);
- its own ``/dev/shm`` (a tmpfs in the pod's mount namespace, lost with the pod: the host copies
  ``nvtrain run`` keeps there die with it, as on a lost Kubernetes pod);
- ``JOB_COMPLETION_INDEX``, ``POD_IP`` and ``HOSTNAME`` in the environment.

DNS records (``<job>-<i>.<service>.<namespace>.svc.<domain>`` and the Service name itself) are
files in a ``--hostsdir`` that dnsmasq watches with inotify, so tests can publish, change and
remove records while pods run. dnsmasq answers authoritatively for the cluster domain
(``--local``): an unknown name is NXDOMAIN; it forwards nothing anywhere (``--no-resolv``).

Namespaces have no default route: processes in them can reach only the bridge's /24. Where
br_netfilter sends bridged frames through iptables (Docker hosts, whose FORWARD policy is DROP),
one ACCEPT rule for traffic between this bridge's own ports is added, and removed at teardown.

Everything created is listed in a registry file holding the owner's pid; ``cleanup_stale``
removes what a crashed earlier run left behind (namespaces and their processes, links,
``/etc/netns`` dirs, the iptables rule, dnsmasq, the pods' short TMPDIRs),
without touching a concurrent run's objects. ``python tests/launcher/multinode/netns_pods.py cleanup``
does the same by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO

__all__ = [
    "Cluster",
    "Pod",
    "cleanup_stale",
    "environment_problem",
    "policy_toml",
]

NS_PREFIX = "nvt-"
BRIDGE_PREFIX = "nvtb-"
VETH_PREFIX = "nvv"
NETNS_ETC = Path("/etc/netns")
_RUN = Path("/run") if Path("/run").is_dir() and os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
REGISTRY = _RUN / "nvtrain-multinode"
_REGISTRY_LOCK = _RUN / "nvtrain-multinode.lock"
SUBNET_BASE = "10.213"
"""The test networks are 10.213.<x>.0/24 with x picked at random among those not in use."""

DOMAIN = "nvtrain.test"
"""Cluster DNS domain of the emulated cluster. Not ``cluster.local``: a ``.local`` name can be
swallowed by mDNS (``mdns4_minimal [NOTFOUND=return]`` in nsswitch.conf) on CI images."""

# Variables of the test process that must not leak into a pod (torchrun/ft_launcher/nvtrain state).
_DROPPED_ENV_PREFIXES = ("TORCHELASTIC_", "NVTRAIN_", "PET_", "GLOO_", "NCCL_", "OMP_")
_DROPPED_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX"}

# Sets the hostname in the pod's own UTS namespace, then becomes the pod's main process.
_HOSTNAME_SHIM = (
    "import os, socket, subprocess, sys; socket.sethostname(sys.argv[1]); "
    "subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=512m,mode=1777', 'pod-shm', '/dev/shm'], "
    "check=True); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)
"""Runs first in a pod: sets its hostname and mounts its own ``/dev/shm`` (``ip netns exec`` gives
every pod a mount namespace of its own, so the tmpfs is seen by that pod only and is gone with
it, as a pod's memory-backed ``/dev/shm`` on Kubernetes)."""


# --------------------------------------------------------------------------------------------
# Small wrappers around `ip`


def _run(argv: list[str], *, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def list_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def kill_namespace_processes(ns: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in ``ns`` until none is left. Returns the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in namespace_pids(ns) if p != os.getpid()]
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes in {ns} survive SIGKILL: {pids}")
        time.sleep(0.05)


def _links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        match = re.match(r"\d+:\s+([^:@\s]+)", line)
        if match:
            names.append(match.group(1))
    return names


def _delete_namespace(ns: str) -> None:
    with contextlib.suppress(RuntimeError):
        kill_namespace_processes(ns)
    _ip("netns", "delete", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def _remove_netns_etc_if_empty() -> None:
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()


def _bridge_traffic_filtered() -> bool:
    """True when br_netfilter passes bridged frames through iptables' FORWARD chain (Docker
    hosts load it and set the chain's policy to DROP, which cuts pods off from each other)."""
    try:
        return Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
    except OSError:
        return False


def _forward_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT", "-m", "comment", "--comment", bridge]


def _open_bridge_forwarding(bridge: str) -> bool:
    """Accept forwarded traffic between the ports of ``bridge`` (only). True if a rule was added."""
    if not _bridge_traffic_filtered() or shutil.which("iptables") is None:
        return False
    return _run(["iptables", "-w", "-I", *_forward_rule(bridge)], check=False).returncode == 0


def _close_bridge_forwarding(bridge: str) -> None:
    if shutil.which("iptables") is None:
        return
    for _ in range(5):  # one rule per bridge; tolerate duplicates
        if _run(["iptables", "-w", "-D", *_forward_rule(bridge)], check=False).returncode != 0:
            return


def _stale_forward_rules(live: set[str]) -> list[str]:
    if shutil.which("iptables") is None:
        return []
    out = _run(["iptables", "-w", "-S", "FORWARD"], check=False).stdout
    found = re.findall(rf"--comment \"?({re.escape(BRIDGE_PREFIX)}([0-9a-f]{{6}}))\"?", out)
    return sorted({bridge for bridge, tag in found if tag not in live})


# --------------------------------------------------------------------------------------------
# Environment check and stale leftovers


def environment_problem() -> str | None:
    """Why these tests cannot run here (an environment limit), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces, veths and a bridge needs root (run the tests as root)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("dnsmasq", "dnsmasq-base")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y {package})"
    probe = f"{NS_PREFIX}probe{secrets.token_hex(3)}"
    proc = _ip("netns", "add", probe, check=False)
    if proc.returncode != 0:
        return f"`ip netns add` does not work here: {proc.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    # A name of its own: test processes probe at the same time (a shared one made the second
    # probe fail with "File exists").
    bridge = f"{BRIDGE_PREFIX}p{secrets.token_hex(3)}"
    proc = _ip("link", "add", bridge, "type", "bridge", check=False)
    if proc.returncode != 0:
        return f"cannot create a bridge here: {proc.stderr.strip()}"
    _ip("link", "delete", bridge, check=False)
    proc = _run(["dnsmasq", "--version"], check=False)
    if proc.returncode != 0:
        return f"dnsmasq does not run: {proc.stderr.strip()}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_tags() -> set[str]:
    tags = set()
    for path in REGISTRY.glob("*.json") if REGISTRY.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if _pid_alive(int(record["owner"])):
                tags.add(path.stem)
    return tags


@contextlib.contextmanager
def _registry_locked() -> Iterator[None]:
    """Hold the lock under which a process registers a cluster, sweeps leftovers or removes the
    registry folder; test processes run side by side and each sweeps when it sets up a cluster.

    Without it a sweep that had read the live owners just before another process registered
    its cluster deleted that cluster's bridge and namespaces as they were being created."""
    _REGISTRY_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_REGISTRY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def cleanup_stale() -> list[str]:
    """Remove what crashed earlier runs left: every object of ours whose owner is gone.

    Returns what was removed (for the log)."""
    with _registry_locked():
        return _cleanup_stale_locked()


def _cleanup_stale_locked() -> list[str]:
    removed: list[str] = []
    live = _live_tags()
    if REGISTRY.is_dir():
        for path in REGISTRY.glob("*.json"):
            if path.stem in live:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                record = json.loads(path.read_text())
                pid = int(record.get("dnsmasq") or 0)
                cmdline = _cmdline(pid) if pid else ""
                if cmdline.startswith("dnsmasq") and f"--listen-address={record['subnet']}.1 " in cmdline:
                    os.kill(pid, signal.SIGKILL)
                    removed.append(f"dnsmasq pid {pid}")
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            REGISTRY.rmdir()
    tag_of_ns = re.compile(rf"^{re.escape(NS_PREFIX)}([0-9a-f]{{6}})-")
    for ns in list_namespaces():
        match = tag_of_ns.match(ns)
        if match and match.group(1) not in live:
            _delete_namespace(ns)
            removed.append(f"netns {ns}")
    for bridge in _stale_forward_rules(live):
        _close_bridge_forwarding(bridge)
        removed.append(f"iptables FORWARD rule for {bridge}")
    for link in _links():
        for prefix in (BRIDGE_PREFIX, VETH_PREFIX):
            tag = link[len(prefix) : len(prefix) + 6]
            if link.startswith(prefix) and re.fullmatch(r"[0-9a-f]{6}", tag) and tag not in live:
                _ip("link", "delete", link, check=False)
                removed.append(f"link {link}")
    for entry in Path(tempfile.gettempdir()).glob(f"{NS_PREFIX}*"):
        match = re.fullmatch(rf"{re.escape(NS_PREFIX)}([0-9a-f]{{6}})", entry.name)
        if match and match.group(1) not in live and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(f"{entry}")
    if NETNS_ETC.is_dir():
        for entry in NETNS_ETC.iterdir():
            match = tag_of_ns.match(entry.name)
            if match and match.group(1) not in live:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"{entry}")
        _remove_netns_etc_if_empty()
    return removed


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# The policy


def policy_toml(
    *,
    job: str,
    nodes: int,
    nproc_per_node: int,
    steps: int,
    checkpoint_dir: Path,
    step_time: float = 0.05,
    log_every: int = 10,
    port: int = 29500,
    dns_timeout: str = "30s",
    join_timeout: str = "60s",
    max_restarts: int = 3,
    escalate_after: int = 3,
    stop_timeout: str = "10s",
    collective_timeout: str = "10s",
    checkpoint_interval: int = 100000,
    domain: str = DOMAIN,
    namespace: str = "default",
    warm_start: bool = True,
) -> str:
    """A policy for the demo job on a ``nodes``-pod emulated cluster. Workers start warm unless
    ``warm_start=False`` (forked from each pod's warm-start server: the same training, a fraction
    of the CPU of a cold start per worker on a 2-core machine)."""
    return f"""\
[job]
name = "{job}"
module = "nvtrain.demo"
warm_start = {str(warm_start).lower()}
args = ["--steps", "{steps}", "--step-time", "{step_time}", "--log-every", "{log_every}"]
nproc_per_node = {nproc_per_node}
max_steps = {steps}
stop_timeout = "{stop_timeout}"
collective_timeout = "{collective_timeout}"

[rendezvous]
nodes = {nodes}
namespace = "{namespace}"
cluster_domain = "{domain}"
port = {port}
dns_timeout = "{dns_timeout}"
join_timeout = "{join_timeout}"

[heartbeat]
initial_timeout = "30s"
timeout = "10s"
monitor_interval = "1s"

[restart]
escalate_after = {escalate_after}

[restart.in_process]
enabled = false

[restart.in_job]
max_restarts = {max_restarts}

[checkpoint]
dir = "{checkpoint_dir}"
interval = {checkpoint_interval}
keep = 2
"""


# --------------------------------------------------------------------------------------------
# Pods and the cluster


@dataclasses.dataclass
class Pod:
    """One incarnation of pod ``index``: a namespace, an address, and its main process."""

    index: int
    generation: int
    ns: str
    address: str
    veth: str
    hostname: str
    fqdn: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    gone: bool = False

    @property
    def label(self) -> str:
        return f"pod {self.index} (gen {self.generation}, {self.address}, netns {self.ns})"

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Cluster:
    """A bridge, a dnsmasq and the pods of one test. Use as a context manager."""

    def __init__(self, workdir: Path, *, job: str, service: str | None = None, namespace: str = "default"):
        self.workdir = workdir
        self.job = job
        self.service = service or job
        self.namespace = namespace
        self.domain = DOMAIN
        self.tag = secrets.token_hex(3)
        self.bridge = f"{BRIDGE_PREFIX}{self.tag}"
        self.subnet: str | None = None
        self.server: str | None = None
        self.hostsdir = workdir / "dns-hosts"
        self.dns_log = workdir / "dnsmasq.log"
        self.dnsmasq: subprocess.Popen[bytes] | None = None
        self.pods: dict[int, Pod] = {}
        self.history: list[Pod] = []
        self._next_host = 10
        self._registry = REGISTRY / f"{self.tag}.json"
        self.tmp_root = Path(tempfile.gettempdir()) / f"{NS_PREFIX}{self.tag}"
        self._namespaces: list[str] = []
        self.firewall_opened = False
        """True when an iptables rule had to be added so that pods reach each other."""

    # -- set-up and teardown ----------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _save_registry(self) -> None:
        with _registry_locked():
            self._save_registry_locked()

    def _save_registry_locked(self) -> None:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        record = {
            "owner": os.getpid(),
            "dnsmasq": self.dnsmasq.pid if self.dnsmasq else None,
            "bridge": self.bridge,
            "subnet": self.subnet,
            "workdir": str(self.workdir),
        }
        # Whole or not at all: another test process's cleanup_stale reads it, and would take a
        # half-written record for a dead owner and remove this cluster's bridge and namespaces.
        partial = self._registry.with_suffix(".partial")
        partial.write_text(json.dumps(record))
        os.replace(partial, self._registry)

    def _pick_subnet(self) -> str:
        used = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", check=False).stdout
        taken = {int(m) for m in re.findall(rf"{re.escape(SUBNET_BASE)}\.(\d+)\.", used)}
        if REGISTRY.is_dir():
            for path in REGISTRY.glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):
                    subnet = json.loads(path.read_text())["subnet"]
                    taken.add(int(subnet.split(".")[2]))
        free = [x for x in range(16, 250) if x not in taken]
        if not free:
            raise RuntimeError(f"no free {SUBNET_BASE}.x.0/24 for the test network")
        return f"{SUBNET_BASE}.{free[secrets.randbelow(len(free))]}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hostsdir.mkdir(exist_ok=True)
        # One step for other test processes: their sweep sees this tag as live before anything
        # of it exists, and two clusters set up side by side do not pick the same subnet.
        with _registry_locked():
            _cleanup_stale_locked()
            self.subnet = self._pick_subnet()
            self.server = f"{self.subnet}.1"
            self._save_registry_locked()  # before creating anything: the tag is a live run's
        # A fixed MAC: by default a bridge takes the lowest MAC of its ports, so it would change
        # when a pod's veth goes away, and the other pods' ARP entries for the DNS server's
        # address would point nowhere for up to half a minute.
        mac = "02:" + ":".join(self.tag[i : i + 2] for i in range(0, 6, 2)) + ":00:01"
        _ip("link", "add", self.bridge, "address", mac, "type", "bridge")
        _ip("addr", "add", f"{self.server}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.firewall_opened = _open_bridge_forwarding(self.bridge)
        self._start_dnsmasq()
        self._save_registry()

    def _start_dnsmasq(self) -> None:
        argv = [
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",  # ignore /etc/dnsmasq.conf and /etc/dnsmasq.d (package dnsmasq)
            "--pid-file=",
            "--user=root",  # the hostsdir lives under pytest's 0700 tmp dirs
            "--bind-interfaces",
            f"--listen-address={self.server}",
            "--port=53",
            "--no-resolv",  # never forward: we answer for the cluster domain only
            "--no-hosts",
            "--no-poll",
            f"--hostsdir={self.hostsdir}",
            f"--local=/{self.domain}/",  # authoritative: unknown names are NXDOMAIN
            "--local-ttl=0",
            "--neg-ttl=1",
            "--log-queries",
            f"--log-facility={self.dns_log}",
        ]
        err = self.workdir / "dnsmasq.stderr"
        with err.open("wb") as stderr:
            self.dnsmasq = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.dnsmasq.poll() is not None:
                raise RuntimeError(f"dnsmasq exited {self.dnsmasq.returncode}: {err.read_text()}")
            if self._dns_answers():
                return
            time.sleep(0.05)
        raise RuntimeError(f"dnsmasq does not answer on {self.server}:53: {err.read_text()}")

    def _dns_answers(self) -> bool:
        """True once dnsmasq answers a query (any answer) on the server address."""
        query = (
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
            + _qname(f"probe.{self.domain}")
            + b"\x00\x01\x00\x01"
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.2)
            try:
                sock.sendto(query, (str(self.server), 53))
                data, _ = sock.recvfrom(512)
            except OSError:
                return False
        return data[:2] == b"\x12\x34"

    def close(self) -> None:
        """Kill every pod, dnsmasq, and delete namespaces, links and /etc/netns dirs."""
        for ns in reversed(self._namespaces):
            with contextlib.suppress(Exception):
                kill_namespace_processes(ns)
        for pod in self.history:
            if pod.popen is not None:
                with contextlib.suppress(Exception):
                    pod.popen.kill()
                    pod.popen.wait(timeout=10)
            pod.close_log()
        if self.dnsmasq is not None:
            with contextlib.suppress(Exception):
                self.dnsmasq.terminate()
                try:
                    self.dnsmasq.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.dnsmasq.kill()
                    self.dnsmasq.wait(timeout=5)
        for ns in self._namespaces:
            with contextlib.suppress(Exception):
                _delete_namespace(ns)
        for link in _links():
            if link == self.bridge or link.startswith(f"{VETH_PREFIX}{self.tag}"):
                _ip("link", "delete", link, check=False)
        if self.firewall_opened:
            _close_bridge_forwarding(self.bridge)
        shutil.rmtree(self.tmp_root, ignore_errors=True)
        with _registry_locked():  # not between another process's mkdir and its record
            _remove_netns_etc_if_empty()  # (nor between its mkdir of /etc/netns and of its pod's folder)
            self._registry.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                REGISTRY.rmdir()

    # -- namespaces ------------------------------------------------------------------------

    def _new_namespace(self, index: int, generation: int) -> Pod:
        ns = f"{NS_PREFIX}{self.tag}-{index}" + (f"-g{generation}" if generation else "")
        veth = f"{VETH_PREFIX}{self.tag}{index}g{generation}"
        if len(veth) > 15:
            raise ValueError(f"interface name {veth} is too long")
        if self._next_host > 99:  # keep the last octet two digits: NVRx sorts address strings
            raise RuntimeError("out of pod addresses")
        address = f"{self.subnet}.{self._next_host}"
        self._next_host += 1
        hostname = f"{self.job}-{index}"
        fqdn = self.pod_name(index)
        self._namespaces.append(ns)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        etc = NETNS_ETC / ns
        # Under the lock: another process removing an empty /etc/netns (its cluster closing, or a
        # sweep) between this mkdir of /etc/netns and of the pod's folder in it failed it.
        with _registry_locked():
            etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(f"nameserver {self.server}\noptions timeout:1 attempts:2\n")
        # What the kubelet writes for a pod with hostname + subdomain.
        (etc / "hosts").write_text(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"{address}\t{fqdn}\t{hostname}\n"
        )
        log_path = self.workdir / f"pod-{index}.g{generation}.log"
        return Pod(index, generation, ns, address, veth, hostname, fqdn, log_path)

    def pod_name(self, index: int) -> str:
        return f"{self.job}-{index}.{self.service}.{self.namespace}.svc.{self.domain}"

    @property
    def service_name(self) -> str:
        return f"{self.service}.{self.namespace}.svc.{self.domain}"

    # -- DNS records -----------------------------------------------------------------------

    def set_record(self, key: str, lines: Iterable[tuple[str, str]]) -> None:
        """Write the hosts file ``key`` (address, name pairs); dnsmasq re-reads it (inotify)."""
        tmp = self.hostsdir / f".{key}.tmp"  # dnsmasq ignores dot files; rename is atomic
        tmp.write_text("".join(f"{addr}\t{name}\n" for addr, name in lines))
        tmp.rename(self.hostsdir / key)

    def remove_record(self, key: str) -> None:
        (self.hostsdir / key).unlink(missing_ok=True)

    def publish(self, pod: Pod) -> None:
        """The pod's DNS records appear: its stable name and the Service name."""
        self.set_record(f"pod-{pod.index}", [(pod.address, pod.fqdn), (pod.address, self.service_name)])

    def unpublish(self, index: int) -> None:
        self.remove_record(f"pod-{index}")

    def lookup(self, name: str, ns: str | None = None) -> list[str]:
        """Addresses of ``name`` as seen from namespace ``ns`` (default: the first pod's)."""
        ns = ns or next(iter(self.pods.values())).ns
        proc = _run(["ip", "netns", "exec", ns, "getent", "ahostsv4", name], check=False)
        return sorted({line.split()[0] for line in proc.stdout.splitlines() if line.strip()})

    # -- pods ------------------------------------------------------------------------------

    def create_pod(self, index: int) -> Pod:
        """A fresh namespace with a new address for pod ``index`` (nothing started yet)."""
        old = self.pods.get(index)
        generation = 0 if old is None else old.generation + 1
        pod = self._new_namespace(index, generation)
        self.pods[index] = pod
        self.history.append(pod)
        return pod

    def run_pod(
        self,
        pod: Pod,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        run_id: str,
    ) -> Pod:
        """Start ``argv`` as pod ``pod.index``'s main process (own session, log to a file)."""
        poddir = self.workdir / f"pod-{pod.index}.g{pod.generation}"
        poddir.mkdir(parents=True, exist_ok=True)
        # A short TMPDIR of the pod's own: NVRx puts AF_UNIX sockets there (108-byte limit;
        # pytest's tmp_path is too long for them).
        tmpdir = self.tmp_root / f"p{pod.index}g{pod.generation}"
        tmpdir.mkdir(parents=True, exist_ok=True)
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in _DROPPED_ENV and not k.startswith(_DROPPED_ENV_PREFIXES)
        }
        pod_env = {
            **base,
            "JOB_COMPLETION_INDEX": str(pod.index),
            "POD_IP": pod.address,
            "HOSTNAME": pod.hostname,
            "NVTRAIN_RUN_ID": run_id,
            "TMPDIR": str(tmpdir),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        full = ["ip", "netns", "exec", pod.ns, "unshare", "--uts", "--"]
        full += [sys.executable, "-c", _HOSTNAME_SHIM, pod.hostname, *argv]
        pod._log = pod.log_path.open("ab")
        shown = " ".join("<script>" if "\n" in arg or len(arg) > 200 else arg for arg in argv)
        pod._log.write(f"### {pod.label}: {shown}\n".encode())
        pod._log.flush()
        pod.popen = subprocess.Popen(
            full,
            cwd=poddir,
            env=pod_env,
            stdin=subprocess.DEVNULL,
            stdout=pod._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return pod

    def start_nvtrain(self, index: int, policy: Path, *, run_id: str, publish: bool = False) -> Pod:
        """Start ``nvtrain run <policy>`` as pod ``index`` in a fresh namespace (a new address).

        ``publish``: its DNS records appear at once; otherwise call ``publish`` later."""
        pod = self.create_pod(index)
        if publish:
            self.publish(pod)
        return self.run_pod(pod, [sys.executable, "-m", "nvtrain", "run", str(policy)], run_id=run_id)

    def replace_pod(self, index: int, policy: Path, *, run_id: str, delay: float = 0.0) -> Pod:
        """Kill pod ``index`` whole (if still there), then start it again under the same name
        with a new namespace and a new address; its DNS record is updated to the new address."""
        if not self.pods[index].gone:
            self.kill_pod(index)
        if delay:
            time.sleep(delay)
        return self.start_nvtrain(index, policy, run_id=run_id, publish=True)

    def kill_pod(self, index: int, *, unpublish: bool = True) -> Pod:
        """The whole pod dies at once: SIGKILL every process in its namespace, remove its
        network (the address disappears) and, by default, its DNS records."""
        pod = self.pods[index]
        kill_namespace_processes(pod.ns)
        if pod.popen is not None:
            pod.popen.wait(timeout=10)
        pod.close_log()
        if unpublish:
            self.unpublish(index)
        _delete_namespace(pod.ns)
        pod.gone = True
        return pod

    def describe(self, tail: int = 60) -> str:
        """Every pod incarnation's status and the end of its log, for assertion messages."""
        parts = []
        for pod in self.history:
            lines = pod.log().splitlines()
            parts.append(
                f"===== {pod.label}: exit {pod.returncode()} ({pod.log_path})\n" + "\n".join(lines[-tail:])
            )
        return "\n".join(parts)


def _qname(name: str) -> bytes:
    return b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00"


if __name__ == "__main__":
    if sys.argv[1:] == ["cleanup"]:
        for item in cleanup_stale():
            print("removed", item)
    else:
        print("usage: netns_pods.py cleanup", file=sys.stderr)
        sys.exit(2)
