#!/usr/bin/env bash
# Records ft_launcher's own log (stdout + stderr of the launcher, its rank monitors and its
# workers) for the installed NVRx, in the scenarios nvtrain's log watcher must understand.
# ft_launcher runs directly (not under nvtrain) with the kind of flags `nvtrain run` passes
# (src/nvtrain/launcher/plan.py), 2 ranks on one node, a plain-Python worker (log_worker.py:
# heartbeats, no torch.distributed, no GPU) and small timeouts.
#
#   PYTHON=python3 bash benchmarks/recovery/record_nvrx_logs.sh OUT_DIR [SCENARIO ...]
#
# Writes OUT_DIR/<nvrx version>/<scenario>.log and OUT_DIR/<nvrx version>/runs.txt (each
# scenario's exit code, duration and command line). Scenarios (default: all, in this order):
#   success              clean run
#   exit3_restart        rank 1 exits with code 3 once; the group restarts and finishes
#   sigkill_restart      rank 1 SIGKILLs itself once; restart
#   hang_restart         rank 1 stops heartbeating; its rank monitor kills it; restart
#   restarts_exhausted   --max-restarts=1 and rank 1 exits with code 3 twice
#   rendezvous_timeout   --nnodes=2:2 with one launcher and join_timeout=5
#   sigterm              SIGTERM to ft_launcher while its workers run
# PORT_BASE (default 29610) picks the rendezvous ports (one per scenario).
set -u
out=${1:?usage: record_nvrx_logs.sh OUT_DIR [SCENARIO ...]}
shift
scenarios=${*:-success exit3_restart sigkill_restart hang_restart restarts_exhausted rendezvous_timeout sigterm}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
version=$("$py" -c 'import importlib.metadata as m; print(m.version("nvidia-resiliency-ext"))') || exit 1
dir=$out/$version
mkdir -p "$dir"
: >"$dir/runs.txt"
port=${PORT_BASE:-29610}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What nvtrain passes for a CPU node without InfiniBand on this version.
case $version in
  0.4.*) version_flags=(--ft-restart-policy=any-failed --ft-enable-nic-monitor=false) ;;
  *) version_flags=(--ft-enable-nic-healthcheck=false --ft-gpu-memory-reclaim-timeout=0) ;;
esac

# launch NAME NNODES MAX_RESTARTS JOIN_TIMEOUT WORKER_ARG...: starts ft_launcher in the
# background (sets $pid) with a watchdog that stops it after 180 s.
launch() {
  name=$1
  local nnodes=$2 restarts=$3 join=$4
  shift 4
  port=$((port + 1))
  local conf="is_host=1,join_timeout=$join"
  case $version in 0.4.*) ;; *) conf+=",store_connect_wait_seconds=$join" ;; esac
  mkdir -p "$work/$name"
  argv=("$py" -m nvidia_resiliency_ext.fault_tolerance.launcher
    "--nnodes=$nnodes" --nproc-per-node=2 --rdzv-backend=c10d
    "--rdzv-endpoint=127.0.0.1:$port" "--rdzv-id=$name" "--rdzv-conf=$conf"
    "--max-restarts=$restarts" --monitor-interval=0.5 --term-timeout=10 --workers-stop-timeout=5
    --ft-initial-rank-heartbeat-timeout=60 --ft-rank-heartbeat-timeout=5
    --ft-workload-check-interval=1 "${version_flags[@]}"
    "$here/log_worker.py" --state-dir "$work/$name" "$@")
  echo "== NVRx $version: $name"
  started=$EPOCHREALTIME
  GROUP_RANK=0 TORCH_CPP_LOG_LEVEL=ERROR PYTHONUNBUFFERED=1 "${argv[@]}" </dev/null >"$dir/$name.log" 2>&1 &
  pid=$!
  (
    for _ in $(seq 180); do
      sleep 1
      kill -0 "$pid" 2>/dev/null || exit 0
    done
    echo "watchdog: $name still running after 180 s, stopping it" >&2
    kill -TERM "$pid"
    sleep 20
    kill -KILL "$pid" 2>/dev/null
  ) &
}

finish() {
  wait "$pid"
  local rc=$?
  local took
  took=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $started }")
  echo "$name rc=$rc seconds=$took cmd=${argv[*]}" >>"$dir/runs.txt"
  echo "   rc=$rc, $took s"
}

for scenario in $scenarios; do
  case $scenario in
    success) launch success 1:1 3 60 --fault none ;;
    exit3_restart) launch exit3_restart 1:1 3 60 --fault exit3 ;;
    sigkill_restart) launch sigkill_restart 1:1 3 60 --fault sigkill ;;
    hang_restart) launch hang_restart 1:1 3 60 --fault hang --steps 48 ;;
    restarts_exhausted) launch restarts_exhausted 1:1 1 60 --fault exit3 --times 2 ;;
    rendezvous_timeout) launch rendezvous_timeout 2:2 0 5 --fault none ;;
    sigterm)
      launch sigterm 1:1 3 60 --fault none --steps 400
      for _ in $(seq 120); do
        [ "$(grep -c '^WORKER ready' "$dir/sigterm.log")" -ge 2 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
      done
      sleep 2
      kill -TERM "$pid"
      ;;
    *)
      echo "unknown scenario: $scenario" >&2
      exit 2
      ;;
  esac
  finish
done
