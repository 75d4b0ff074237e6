#!/usr/bin/env bash
# Install the Azurite blob emulator (pinned) into <repo>/.tools/azurite for the Azure tests.
# Usage: scripts/install_azurite.sh [target_dir]
# Azurite 3.35.0 is the newest release that runs on Node 20 (3.37 needs Node 22).
set -euo pipefail

AZURITE_VERSION="3.35.0"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${1:-$REPO/.tools/azurite}"
BIN="$TARGET/node_modules/.bin/azurite"

if ! command -v npm >/dev/null 2>&1; then
    echo "install_azurite: npm not found; install Node.js >= 18 (Debian: apt-get install nodejs npm)" >&2
    exit 1
fi

if [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null)" = "$AZURITE_VERSION" ]; then
    echo "install_azurite: azurite $AZURITE_VERSION already in $TARGET"
    exit 0
fi

mkdir -p "$TARGET"
# A private package.json keeps npm from walking up into the repo.
[ -f "$TARGET/package.json" ] || echo '{"name": "sparkseg-tools-azurite", "private": true}' > "$TARGET/package.json"
npm install --prefix "$TARGET" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION"
echo "install_azurite: installed $("$BIN" --version) at $BIN"
