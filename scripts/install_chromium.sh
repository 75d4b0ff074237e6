#!/usr/bin/env bash
# Install headless Chromium and its WebDriver from Debian packages for the report page test
# (tests/test_render_browser.py). Does nothing when /usr/bin/chromium is already there.
# Usage: scripts/install_chromium.sh     (as root, or with sudo on PATH)
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    echo "install_chromium: $(/usr/bin/chromium --version 2>/dev/null || echo chromium) already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_chromium: not root and no sudo; run as root: apt-get install chromium chromium-driver" >&2
        exit 1
    fi
    SUDO=sudo
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: apt-get not found; install Chromium and chromedriver with your package manager" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
echo "install_chromium: installed $(/usr/bin/chromium --version) and $(/usr/bin/chromedriver --version | head -1)"
