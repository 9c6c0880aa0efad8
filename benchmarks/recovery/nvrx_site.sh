# Sourced by nvrx_versions.sh and pod0_versions.sh: install one NVRx wheel directory into a
# site directory of its own, next to the other wheels of the first (common) directory.
#   nvrx_site COMMON_DIR WHEEL_DIR  -> sets $site and $version
nvrx_site() {
  local common=$1 dir=$2
  site=/tmp/site-$(basename "$dir")
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    $(ls "$common"/*.whl | grep -v nvidia_resiliency_ext) "$dir"/nvidia_resiliency_ext-*.whl || return 1
  version=$(PYTHONPATH=$site python3 -c "import importlib.metadata as m; print(m.version('nvidia-resiliency-ext'))")
}
