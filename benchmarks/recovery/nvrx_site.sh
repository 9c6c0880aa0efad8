# Kept for the commands that source it (tests/launcher/nvrx_logs/README.md, CONTRIBUTING.md):
# nvrx_site and the rest of the device preamble live in benchmarks/gpu_env.sh.
#   nvrx_site COMMON_DIR WHEEL_DIR  -> sets $site and $version
. "$(dirname "${BASH_SOURCE[0]}")/../gpu_env.sh"
