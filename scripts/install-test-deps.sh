#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine (run as root, or with sudo for apt).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: Chromium and Firefox for the browser tests, coturn for the TURN relay test,
# GStreamer's webrtcbin (driven from the system Python through PyGObject) and ffmpeg for the
# interop tests against software nobody here wrote.
missing=()
for pkg in chromium firefox-esr coturn ffmpeg python3-gi gir1.2-gstreamer-1.0 \
    gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0 gstreamer1.0-plugins-base \
    gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python -m pip install -q --disable-pip-version-check -e ".[test]"
# Test-only oracle: Kyutai's reference implementation. It pins an older torch and numpy, so it
# goes in without its dependencies; its few imports are listed here.
python -m pip install -q --disable-pip-version-check --no-deps "moshi==0.2.13"
python -m pip install -q --disable-pip-version-check einops huggingface_hub
