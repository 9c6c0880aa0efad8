#!/usr/bin/env bash
# NVRx 0.6/0.7 on the device machine: the sections client under nvtrain run, then the hang
# detection benchmark. NVRx and its needs carried as wheels in .whl/ (benchmarks/gpu_env.sh); results into $OUT.
#   bash benchmarks/nvrx_clients_device.sh
. "$(dirname "$0")/gpu_env.sh"
gpu_env || exit 1
echo "nvrx $version"
out_dir /tmp/nvrx-clients
T=$(mktemp -d)
cat > $T/sections.toml <<EOT
[job]
name = "sections"
script = "$PWD/tests/support/bin/nvrx_client.py"
args = ["--mode", "sections", "--step-time", "0.2", "--steps", "10", "--save-every", "4", "--hang-step", "5"]
nproc_per_node = 2
stop_timeout = "3s"
[heartbeat]
monitor_interval = "1s"
out_of_section_timeout = "30s"
[heartbeat.sections]
init = "60s"
step = "3s"
checkpoint = "auto"
[restart.in_process]
enabled = false
[restart.in_job]
max_restarts = 2
[checkpoint]
dir = "$T/ckpt"
EOT
timeout 150 python3 -m nvtrain run --run-id sec $T/sections.toml > $OUT/sections.out 2> $OUT/sections.err; echo "sections exit $?"
grep -h "hang_detected\|Section\|Unknown\|CLIENT DONE" $OUT/sections.out $OUT/sections.err | head -12
cp $T/ckpt/sec/launcher-node0.log $OUT/sections-launcher.log 2>/dev/null
timeout 400 python3 benchmarks/hang_detection_nvrx_client.py --runs 3 > $OUT/hang.json 2> $OUT/hang.err; echo "hang bench exit $?"
python3 -c "import json; d=json.load(open('$OUT/hang.json')); print({k: {kk: vv for kk, vv in v.items() if kk != 'samples'} for k, v in d.items()})" || tail -20 $OUT/hang.err
