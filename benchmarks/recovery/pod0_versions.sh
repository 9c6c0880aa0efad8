#!/usr/bin/env bash
# Losing pod 0 on each NVRx version installed from wheels, with the store in pod 0 and in the
# control pod (`nvtrain control`): benchmarks/recovery/pod0_loss.py per arrangement, as root
# (it maps the pod names in /etc/hosts). CPU only (gloo), so any Linux machine with the wheels.
#   bash benchmarks/recovery/pod0_versions.sh OUT_DIR WHEEL_DIR_0.7 [WHEEL_DIR_0.6 ...]
# Each wheel directory holds an nvidia_resiliency_ext wheel; the other wheels (pydantic, ...)
# come from the first directory. STORES overrides the arrangements ("pod0 control").
set -u
out=$1; shift
mkdir -p "$out"
common=$1
. "$(dirname "$0")/../gpu_env.sh"
for dir in "$@"; do
  nvrx_site "$common" "$dir" || exit 1
  use_site
  for store in ${STORES:-pod0 control}; do
    echo "== NVRx $version, store = $store"
    python3 benchmarks/recovery/pod0_loss.py --write-hosts --store "$store" --timeout "${PHASE_TIMEOUT:-150}" \
      --out "/tmp/p0-$version-$store" --json "$out/pod0-loss-$version-$store.json" 2>&1 | tail -40
    tar czf "$out/pod0-loss-$version-$store-logs.tgz" -C "/tmp/p0-$version-$store" --exclude 'ckpt/*/step-*' . 2>/dev/null
  done
done
