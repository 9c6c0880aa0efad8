# The one preamble of the device-machine wrappers (sourced, from the repository root):
# NVRx and what it needs that the image lacks, installed from wheels into a site folder of their
# own; PYTHONPATH, PATH and unbuffered output for it and this checkout's src; the output folder.
#
#   . benchmarks/gpu_env.sh
#   gpu_env [WHEEL_DIR]            every wheel of WHEEL_DIR (default .whl) into a site, then use_site
#   nvrx_site COMMON_DIR WHEEL_DIR the NVRx wheel of WHEEL_DIR and the other wheels of COMMON_DIR
#                                  into /tmp/site-<name of WHEEL_DIR>; sets $site and $version
#   use_site [SITE]                export PYTHONPATH=SITE:$PWD/src, PATH=SITE/bin:<PATH before
#                                  the first use_site>, PYTHONUNBUFFERED=1 (SITE: default $site)
#   out_dir [DEFAULT]              OUT=${OUT:-DEFAULT}; mkdir -p "$OUT"
# Each function returns non-zero when it fails; the caller decides (`gpu_env || exit 1`).

nvrx_site() {
  local common=$1 dir=$2
  site=/tmp/site-$(basename "$dir")
  rm -rf "$site"
  # A site of an earlier call may be on PYTHONPATH: keep it out of pip's way.
  # shellcheck disable=SC2046  # one word per wheel file
  env -u PYTHONPATH python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    $(ls "$common"/*.whl | grep -v nvidia_resiliency_ext) "$dir"/nvidia_resiliency_ext-*.whl || return 1
  version=$(PYTHONPATH=$site python3 -c "import importlib.metadata as m; print(m.version('nvidia-resiliency-ext'))")
}

use_site() {
  local chosen=${1:-$site}
  : "${_gpu_env_path:=$PATH}"
  export PYTHONPATH=$chosen:$PWD/src PATH=$chosen/bin:$_gpu_env_path PYTHONUNBUFFERED=1
}

gpu_env() {
  local wheels=${1:-.whl}
  nvrx_site "$wheels" "$wheels" || return 1
  use_site "$site"
  python3 -c "import nvidia_resiliency_ext" || return 1
}

out_dir() {
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
}
