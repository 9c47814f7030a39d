#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine (run as root, or with sudo for apt).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: Chromium and Firefox for the browser tests, coturn for the TURN relay test
# (the binary only: tests/support/turn.py starts its own turnserver on 127.0.0.1),
# GStreamer's webrtcbin (driven from the system Python through PyGObject), ffmpeg and sipp
# (sip-tester, the SIP tests' caller: tests/sip/), baresip-core (a softphone) and kamailio
# (the SIP proxy) for the interop tests against software nobody here wrote; redis-server and
# haproxy for the cluster tests (tests/cluster/ starts its own on loopback); espeak-ng for
# the test peer's `say` steps (tests/peer/, examples/); iproute2 and nftables for the NAT
# tests' network namespaces (tests/support/netns.py), conntrack to flush a NAT's state when
# its address changes mid-call (tests/web/test_web_nat_netns.py).
missing=()
for pkg in chromium firefox-esr coturn ffmpeg python3-gi gir1.2-gstreamer-1.0 \
    gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0 gstreamer1.0-plugins-base \
    gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice sip-tester \
    redis-server haproxy baresip-core kamailio espeak-ng iproute2 nftables conntrack; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  # coturn's package starts a TURN server as a system service; the tests start their own on
  # loopback, so keep package scripts from starting services (policy-rc.d exit 101 = deny),
  # unless the machine already has a policy of its own.
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  trap '[ -n "$own_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  [ -n "$own_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d
  own_policy=""
fi
# Installed, never enabled or running: a developer machine must not serve TURN afterwards
# (also undoes what an earlier version of this script left behind).
if dpkg -s coturn >/dev/null 2>&1; then
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now coturn >/dev/null 2>&1 || true
  elif command -v update-rc.d >/dev/null 2>&1; then
    $SUDO update-rc.d coturn disable >/dev/null 2>&1 || true
    $SUDO service coturn stop >/dev/null 2>&1 || true
  fi
fi

python -m pip install -q --disable-pip-version-check -e ".[test]"
# Test-only oracle: Kyutai's reference implementation. It pins an older torch and numpy, so it
# goes in without its dependencies; its few imports are listed here.
python -m pip install -q --disable-pip-version-check --no-deps "moshi==0.2.13"
python -m pip install -q --disable-pip-version-check einops huggingface_hub
