#!/usr/bin/env bash
# Set up (packages, build), then run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 "$@"
