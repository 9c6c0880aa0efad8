#!/usr/bin/env bash
# Issue 16 on one GPU, part 2: SIGKILL -> next step with the host copy and a warm start.
#   bash benchmarks/recovery/gpu_warm.sh demo4096   # the demo --width 4096: memory, warm, storage (or $ARMS)
#   bash benchmarks/recovery/gpu_warm.sh sigkill    # a plain torchrun script: nvtrain, warm, torchrun
#   bash benchmarks/recovery/gpu_warm.sh demo4gb    # the 4 GB demo: warm vs storage ($FAULTS, $STEPS)
# (NVRx and its needs carried as wheels in .whl/; results into $OUT.)
. "$(dirname "$0")/../gpu_env.sh"
gpu_env || exit 1
out_dir /tmp/gpu-warm
for part in "$@"; do
  case $part in
    demo4096)
      timeout 330 python3 benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl --demo-args "--width 4096" \
        --arms "${ARMS:-warm,memory,storage}" --faults 4 --repeats 1 --steps 90 --disk-gb 1 --timeout 110 --out /tmp/hc \
        --json "$OUT/warm-4096.json" > "$OUT/warm-4096.log" 2>&1
      echo "demo4096 exit $?"; grep -v "Warning\|warn" "$OUT/warm-4096.log" | tail -8 ;;
    sigkill)
      timeout 200 python3 benchmarks/recovery/sigkill.py --faults 3 --repeats 1 --startup-reps 0 \
        --json "$OUT/sigkill-warm.json" > "$OUT/sigkill-warm.log" 2>&1
      echo "sigkill exit $?"; grep -E "^\| (nvtrain|torchrun)|^- median" "$OUT/sigkill-warm.log" | head -20 ;;
    demo4gb)
      timeout 500 python3 benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl \
        --demo-args "--width 8192 --depth 5" --arms warm,storage --faults "${FAULTS:-2}" --repeats 1 \
        --steps "${STEPS:-60}" --interval 20 \
        --step-time 0.2 --disk-gb 1 --timeout 160 --out /tmp/hc4 \
        --json "$OUT/warm-4gb.json" > "$OUT/warm-4gb.log" 2>&1
      echo "demo4gb exit $?"; grep -v "Warning\|warn" "$OUT/warm-4gb.log" | tail -7 ;;
  esac
done
ls /dev/shm
