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

# The services that start at boot: sysvinit's rc links and systemd's wants links (Debian's
# packages make both, whichever init runs).
enabled_services() {
  { find /etc/rc2.d /etc/rc3.d /etc/rc4.d /etc/rc5.d -name 'S*' -printf '%f\n' 2>/dev/null \
      | sed 's/^S[0-9]*//'
    find /etc/systemd/system -path '*.wants/*.service' -printf '%f\n' 2>/dev/null \
      | sed 's/\.service$//'
  } | sort -u
}

# Stopped and kept from starting at boot, under systemd and sysvinit alike (quiet, and
# harmless when it already is).
disable_service() {
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now "$1" >/dev/null 2>&1 || true
    return
  fi
  if [ -x "/etc/init.d/$1" ]; then
    $SUDO service "$1" stop >/dev/null 2>&1 || true
    $SUDO update-rc.d "$1" disable >/dev/null 2>&1 || true
  fi
  if command -v deb-systemd-helper >/dev/null 2>&1; then
    $SUDO deb-systemd-helper disable "$1.service" >/dev/null 2>&1 || true
  fi
}

newly_enabled=""
if [ "${#missing[@]}" -gt 0 ]; then
  before="$(enabled_services)"
  $SUDO apt-get update -qq
  # Package scripts must not start the servers they install (coturn, redis, haproxy,
  # kamailio: the tests start their own on loopback): policy-rc.d exit 101 = deny, unless the
  # machine already has a policy of its own.
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  trap '[ -n "$own_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  # dpkg's progress goes to a log, shown only when the install fails.
  apt_log="$(mktemp)"
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    exit 1
  fi
  rm -f "$apt_log"
  [ -n "$own_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d
  own_policy=""
  newly_enabled="$(comm -13 <(echo "$before") <(enabled_services))"
fi
# Installed, never enabled or running: a developer machine must not serve TURN, SIP, Redis
# or a load balancer afterwards. The servers of the list above are test tools here (also
# undoes what earlier versions of this script left behind); any other service the packages
# enabled on the way (a dependency's) goes the same way. Enable one yourself if you want it.
for service in coturn kamailio haproxy redis-server $newly_enabled; do
  if [ -x "/etc/init.d/$service" ] || [ -e "/lib/systemd/system/$service.service" ]; then
    disable_service "$service"
  fi
done

# Test-only oracle: Kyutai's reference implementation (moshi). It pins an older torch and
# numpy than the project's, so it goes in without its dependencies (its few imports are listed
# here). pip then reports moshi's unmet pins (an `ERROR: pip's dependency resolver...` block)
# whenever a later install touches one of its dependencies: --no-warn-conflicts keeps that
# out, as only the tests import moshi. (--no-deps skips the report by itself.)
python -m pip install -q --disable-pip-version-check --no-warn-conflicts -e ".[test]"
python -m pip install -q --disable-pip-version-check --no-warn-conflicts einops huggingface_hub
python -m pip install -q --disable-pip-version-check --no-deps "moshi==0.2.13"
