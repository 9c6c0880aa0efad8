#!/usr/bin/env bash
# The in-process + in-job layers together on each NVRx version installed from wheels: 2 ranks,
# NCCL, 5 faults (default: exception, collective hang, Python hang, SIGKILL, exception), on a
# GPU machine; NPROC and KINDS override the ranks and the faults.
#   bash benchmarks/recovery/nvrx_versions.sh OUT_DIR WHEEL_DIR_0.7 [WHEEL_DIR_0.6 ...]
# Each wheel directory holds an nvidia_resiliency_ext wheel plus what it needs that the image
# lacks; the other wheels (pydantic, ...) come from the first directory.
set -u
out=$1; shift
mkdir -p "$out"
common=$1
. "$(dirname "$0")/../gpu_env.sh"
for dir in "$@"; do
  nvrx_site "$common" "$dir" || exit 1
  use_site
  echo "== NVRx $version"
  python3 benchmarks/recovery/side_by_side.py --nproc "${NPROC:-2}" --backend nccl --demo-args "--width 4096" \
    --arms in-process --modes async --kinds "${KINDS:-exception,collective_hang,hang,sigkill,exception}" \
    --timeout 200 --out "/tmp/nvrx-$version" --json "$out/nvrx-$version.json"
  tar czf "$out/nvrx-$version-logs.tgz" -C "/tmp/nvrx-$version" --exclude ckpt/*/step-* . 2>/dev/null
done
