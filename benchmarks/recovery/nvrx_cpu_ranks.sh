#!/usr/bin/env bash
# Issue 19, the part one GPU and the CPUs allow (device machine, one H200): the recovery tests of
# the suite that run several ranks per node under the real ft_launcher (CPU, gloo), run against
# the NVRx of WHEEL_DIR instead of CI's 0.4.1; the soak (4 ranks, every injectable fault kind and
# SIGKILLs from outside) for SOAK_S seconds beside them; and whether two NCCL ranks can share the
# one GPU (benchmarks/recovery/one_gpu_two_ranks.py).
#   bash benchmarks/recovery/nvrx_cpu_ranks.sh OUT_DIR WHEEL_DIR [SOAK_S=100]
set -u
out=$1; wheels=$2; soak_s=${3:-100}
mkdir -p "$out"
. "$(dirname "$0")/../gpu_env.sh"
gpu_env "$wheels" || exit 1
echo "== NVRx $version, Python $(python3 -c 'import sys; print(sys.version.split()[0])'), $(nproc) CPUs, $(date -u +%FT%TZ)"
python3 benchmarks/recovery/one_gpu_two_ranks.py 2>&1 | grep -v Warning | tee "$out/one_gpu_two_ranks.txt"
# The rest runs on the CPUs: hide the GPU, or each rank takes cuda:<local rank> (context.py).
export CUDA_VISIBLE_DEVICES=
timeout $((3 * soak_s + 150)) python3 benchmarks/soak/soak.py --duration "$soak_s" --snapshot none \
  --out /tmp/soak-nvrx --json "$out/soak.json" --interval 8 --fault-every 30 --kill-every 40 \
  --seed 19 --timeout $((2 * soak_s + 120)) > "$out/soak.log" 2>&1 &
soak=$!
# pytest-benchmark (installed there) warns under xdist, and the suite turns warnings into errors.
timeout 400 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 6 --dist loadfile -m slow --durations=15 \
  tests/worker/test_fault_matrix.py tests/worker/test_recovery.py tests/worker/test_inprocess_hang.py \
  tests/worker/test_stop_during_save.py tests/worker/test_reuse.py tests/worker/test_killed_writer.py \
  tests/launcher/test_run_faults.py tests/launcher/test_run_root_cause.py tests/launcher/test_run_outcomes.py \
  tests/launcher/test_nvrx_clients.py tests/launcher/test_launcher_orphans.py > "$out/pytest.log" 2>&1
echo "tests exit $?"; grep -E "passed|failed|^FAILED|^ERROR" "$out/pytest.log" | tail -15
wait "$soak"; echo "soak exit $?"; tail -25 "$out/soak.log"
