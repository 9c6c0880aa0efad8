#!/usr/bin/env bash
# Issue 16 on one GPU (NVRx and its needs carried as wheels in .whl/, see BENCHMARKS.md):
# (1) the blocked time of the first and later async saves of an 8.86 GB FSDP2 state with the
#     buffers prepared ahead, process memory vs the host copy vs 4 writer threads, and the
#     background write rate against the disk's; (2) SIGKILL -> next step of the demo with
#     --width 4096, restored from the host copy vs from storage, arms alternating.
#   bash benchmarks/recovery/gpu_hostcopy.sh   (writes into $OUT)
. "$(dirname "$0")/../gpu_env.sh"
gpu_env || exit 1
out_dir /tmp/gpu-hostcopy
df -h /dev/shm /tmp | tail -2; free -g | head -2
shm=/dev/shm
avail=$(df --output=avail -B1G /dev/shm | tail -1)
if [ "$avail" -lt 24 ]; then mkdir -p /tmp/memfs && mount -t tmpfs -o size=40g tmpfs /tmp/memfs && shm=/tmp/memfs; fi
echo "host copy folder: $shm"
timeout 230 python3 benchmarks/checkpoint/blocked_time.py --size-gb 8 --saves 3 \
  --arms nvtrain-async,nvtrain-async-shm,nvtrain-async-4w --prepare --disk-gb 4 --dir /tmp/ckpt \
  --shm "$shm/bt" --json "$OUT/blocked.json" > "$OUT/blocked.log" 2>&1
echo "blocked exit $?"; grep -v "Warning\|warn" "$OUT/blocked.log" | tail -16
rm -rf /tmp/ckpt "$shm/bt"
timeout 320 python3 benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl --demo-args "--width 4096" \
  --faults 3 --repeats 2 --steps 70 --disk-gb 2 --timeout 110 --memory-dir "$shm" --out /tmp/hc \
  --json "$OUT/hostcopy-4096.json" > "$OUT/hostcopy-4096.log" 2>&1
echo "hostcopy exit $?"; grep -v "Warning\|warn" "$OUT/hostcopy-4096.log" | tail -9
ls "$shm"
