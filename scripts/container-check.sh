#!/usr/bin/env bash
# Builds deploy/Dockerfile on a Debian base made here from Debian packages (no registry image
# can be pulled on the project's machines), runs the image, and calls into it with the
# headless peer through its published TCP and UDP ports. Needs root, podman, runc,
# debootstrap and iptables (apt-get install podman runc debootstrap iptables); takes a few
# minutes, so it is not part of the test suite: docs/deployment.md "Containers".
#
#   bash scripts/container-check.sh            # build, run, call, stop
#   KEEP_BASE=1 bash scripts/container-check.sh   # reuse the base image made last time
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
work=${CONTAINER_CHECK_DIR:-/var/tmp/duplex-container-check}
base=localhost/duplex-base:bookworm
image=localhost/duplex-agent:check
name=duplex-agent-check
http_port=18080
udp_low=40000; udp_high=40009
mkdir -p "$work"

# This machine's container runtime: runc (crun refuses hybrid cgroups) and no default
# rlimits (the sandbox may not raise them).
conf="$work/containers.conf"
printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' > "$conf"
export CONTAINERS_CONF="$conf"

if [ -z "${KEEP_BASE:-}" ] || ! podman image exists "$base"; then
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
  rm -f "$work"/rootfs/var/cache/apt/archives/*.deb
  # The machine's own CA bundle, so pip inside the build trusts what this host trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
fi
echo "base image ready after $(( $(date +%s) - started )) s"

# torch from the machine's wheel folder (pip's find-links) instead of the CPU index.
links=$(python -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)
podman build --format docker --network host -v "$links:/wheels:ro" \
  --build-arg BASE="$base" --build-arg TORCH_INDEX= --build-arg PIP_FIND_LINKS=/wheels \
  -f deploy/Dockerfile -t "$image" . >"$work/build.log"
echo "image built after $(( $(date +%s) - started )) s"

podman rm -f "$name" >/dev/null 2>&1 || true
cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
podman run -d --name "$name" \
  -p "127.0.0.1:$http_port:8080" -p "127.0.0.1:$udp_low-$udp_high:$udp_low-$udp_high/udp" \
  -e AGENT_RTC_PORTS="$udp_low-$udp_high" -e AGENT_RTC_ADVERTISE=127.0.0.1 \
  -e AGENT_MAX_SESSIONS=4 "$image" >/dev/null 2>>"$work/podman.log"
for _ in $(seq 60); do
  curl -fs "http://127.0.0.1:$http_port/health/live" >/dev/null && break
  sleep 0.5
done
podman healthcheck run "$name" 2>>"$work/podman.log"
echo "healthcheck: healthy"
[ "$(podman exec "$name" id -u)" != 0 ] || { echo "FAIL: runs as root"; exit 1; }
report=$(python -m agent.peer "http://127.0.0.1:$http_port" --seconds 4 --json)
python - "$report" "$udp_low" "$udp_high" <<'PY'
import json, sys
report = json.loads(sys.argv[1])
print(f"call {report['call_id']}: connected={report['connected']} "
      f"echo correlation={report['correlation']} delay={report['delay_ms']} ms")
assert report["connected"] and (report["correlation"] or 0) >= 0.9, report
PY
podman stop --time 10 "$name" >/dev/null 2>>"$work/podman.log"
podman logs "$name" 2>&1 | grep -q "drain finished" && echo "SIGTERM: drained and stopped"
echo "container check passed in $(( $(date +%s) - started )) s"
