#!/usr/bin/env bash
# In-process recovery on one GPU (NVRx from wheels; see docs in BENCHMARKS.md, "In-process
# recovery cost"): (1) the demo with --width 4096, exceptions and a hang, failure_window 1 s
# (NVRx's default) against nvtrain's 100 ms, arms alternating; (2) the 4 GB demo of
# benchmarks/checkpoint/gpu_demo.toml (two exceptions and a SIGKILL).
#   bash benchmarks/recovery/gpu_inprocess.sh OUT_DIR WHEEL_DIR [REPEATS]
set -u
out=$1; wheels=$2; repeats=${3:-2}
mkdir -p "$out"
. "$(dirname "$0")/../gpu_env.sh"
gpu_env "$wheels" || exit 1
echo "== NVRx $version, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
python3 benchmarks/recovery/side_by_side.py --nproc 1 --backend nccl --demo-args "--width 4096" \
  --arms in-process@1s,in-process@100ms --modes async --kinds exception,exception,hang \
  --faults 6 --repeats "$repeats" --timeout 150 --out /tmp/gpu-window --json "$out/window.json"
python3 benchmarks/recovery/side_by_side.py --summarize "$out/window.json" | tee "$out/window.md"
rm -rf /tmp/gpu-demo-ckpt
python3 -m nvtrain run benchmarks/checkpoint/gpu_demo.toml --run-id gpu4gb > "$out/gpu4gb.log" 2>&1
echo "4 GB demo exit $?"
python3 -m nvtrain report /tmp/gpu-demo-ckpt/gpu4gb --json > "$out/gpu4gb-report.json"
python3 -m nvtrain report /tmp/gpu-demo-ckpt/gpu4gb | sed -n '/Incidents/,/Restarts/p'
for log in /tmp/gpu-demo-ckpt/gpu4gb/events*.jsonl; do  # every pod's: events-node<N>.jsonl
  cp "$log" "$out/gpu4gb-${log##*/}"
done
