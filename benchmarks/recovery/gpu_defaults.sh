#!/usr/bin/env bash
# Issue 37 on one H200: the default path (no warm-start key, no memory_dir key), NVRx from the
# wheels in .whl/ (0.7.0), one rank per GPU (NCCL refuses two ranks on one GPU). Results in $OUT.
#   bash benchmarks/recovery/gpu_defaults.sh demo       # SIGKILL -> next step, demo --width 4096 and the 4 GB demo
#   bash benchmarks/recovery/gpu_defaults.sh inprocess  # exception -> next step, demo --width 4096
#   bash benchmarks/recovery/gpu_defaults.sh inprocess-drop  # the same, each fault right after a save began,
#                                                         # finish_in_flight true against false
#   bash benchmarks/recovery/gpu_defaults.sh frameworks # DDP, HF Trainer, Lightning scripts: torchrun vs nvtrain run
#   bash benchmarks/recovery/gpu_defaults.sh sigkill    # benchmarks/recovery/sigkill.py, monitor interval 0.1 s
#   bash benchmarks/recovery/gpu_defaults.sh restore    # hostcopy_restore.py into GPU memory, 4 GB
#   bash benchmarks/recovery/gpu_defaults.sh integrations  # issue 38: HF, Lightning, accelerate vs torchrun
#   bash benchmarks/recovery/gpu_defaults.sh tolerance  # issue 38: a faulted run's final state vs fault-free ones
#   bash benchmarks/recovery/gpu_defaults.sh tolerance-deterministic  # the same with deterministic kernels
# (integrations, tolerance: the image's transformers, lightning and accelerate; keep newer wheels
# off PYTHONPATH, benchmarks/integrations/README.md says why)
. "$(dirname "$0")/../gpu_env.sh"
gpu_env || exit 1
out_dir /tmp/gpu-defaults
for part in "$@"; do
  case $part in
    demo)
      timeout 200 python3 benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl --demo-args "--width 4096" \
        --arms memory --faults 4 --repeats 1 --steps 90 --disk-gb 1 --timeout 150 --out /tmp/hc \
        --json "$OUT/demo-4096.json" > "$OUT/demo-4096.log" 2>&1
      echo "demo4096 exit $?"; grep -v "Warning\|warn" "$OUT/demo-4096.log" | tail -8
      timeout 260 python3 benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl \
        --demo-args "--width 8192 --depth 5" --arms memory --faults 2 --repeats 1 --steps 60 --interval 20 \
        --step-time 0.2 --disk-gb 1 --timeout 220 --out /tmp/hc4 \
        --json "$OUT/demo-4gb.json" > "$OUT/demo-4gb.log" 2>&1
      echo "demo4gb exit $?"; grep -v "Warning\|warn" "$OUT/demo-4gb.log" | tail -7 ;;
    inprocess)
      timeout 150 python3 benchmarks/recovery/side_by_side.py --nproc 1 --backend nccl --demo-args "--width 4096" \
        --arms in-process --modes async --kinds exception --faults 4 --repeats 1 --timeout 120 \
        --out /tmp/gpu-ip --json "$OUT/inprocess.json" > "$OUT/inprocess.log" 2>&1
      echo "inprocess exit $?"
      python3 benchmarks/recovery/side_by_side.py --summarize "$OUT/inprocess.json" | tee "$OUT/inprocess.md" | tail -12 ;;
    inprocess-drop)
      for f in true false; do
        timeout 140 python3 benchmarks/recovery/side_by_side.py --nproc 1 --backend nccl --demo-args "--width 4096" \
          --arms in-process --modes async --kinds exception --faults 4 --repeats 1 --timeout 110 \
          --fault-offset 0 --finish-in-flight $f \
          --out /tmp/gpu-ip-$f --json "$OUT/inprocess-inflight-$f.json" > "$OUT/inprocess-inflight-$f.log" 2>&1
        echo "inprocess finish_in_flight=$f exit $?"
        python3 benchmarks/recovery/side_by_side.py --summarize "$OUT/inprocess-inflight-$f.json" \
          | tee "$OUT/inprocess-inflight-$f.md" | tail -8
      done ;;
    frameworks)
      timeout 560 python3 benchmarks/frameworks/compare.py --nproc 1 --scripts ddp,hf,lightning --repeats 3 \
        --timeout 120 --json "$OUT/frameworks.json" > "$OUT/frameworks.log" 2>&1
      echo "frameworks exit $?"; grep -E "recovery median" "$OUT/frameworks.log" ;;
    sigkill)
      timeout 300 python3 benchmarks/recovery/sigkill.py --faults 3 --repeats 2 --startup-reps 0 --monitor-interval 0.1 \
        --json "$OUT/sigkill.json" > "$OUT/sigkill.log" 2>&1
      echo "sigkill exit $?"; grep -E "^\| (nvtrain|torchrun)|^- median" "$OUT/sigkill.log" | head -20 ;;
    integrations)
      for fw in hf lightning accelerate; do
        timeout 190 python3 benchmarks/integrations/compare.py --frameworks $fw --nproc 1 --steps 40 \
          --save-every 10 --faults exception:12,sigkill:22,hang:32 --soft-timeout 5 --hang-wait 12 --timeout 91 \
          --keep "$OUT/integ-runs" --json "$OUT/integ-$fw.json" > "$OUT/integ-$fw.log" 2>&1
        echo "integrations $fw exit $?"; grep -A3 "^$fw " "$OUT/integ-$fw.log" | cut -c1-240
      done ;;
    tolerance|tolerance-deterministic)
      extra=(); [ "$part" = tolerance-deterministic ] && extra=(--deterministic)
      for fw in hf lightning accelerate; do
        timeout 330 python3 benchmarks/integrations/tolerance.py --frameworks $fw --nproc 1 --steps 40 \
          --save-every 10 --faults exception:12,sigkill:22,hang:32 --soft-timeout 5 --timeout 100 "${extra[@]}" \
          --keep "$OUT/$part-runs" --json "$OUT/$part-$fw.json" > "$OUT/$part-$fw.log" 2>&1
        echo "$part $fw exit $?"; tail -2 "$OUT/$part-$fw.log"
      done ;;
    restore)
      timeout 200 python3 benchmarks/recovery/hostcopy_restore.py --size 4G --repeats 3 --device cuda --first-step \
        --json "$OUT/restore.json" > "$OUT/restore.log" 2>&1
      echo "restore exit $?"; tail -15 "$OUT/restore.log" ;;
  esac
done
