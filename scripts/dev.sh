#!/usr/bin/env bash
# The first command on a fresh machine: installs the build's system packages if they are
# missing, then builds and starts `fencegate dev` (three nodes, their fencing proxies and the
# demo store). Arguments go to `fencegate dev`, e.g. `scripts/dev.sh --data-dir /tmp/fg`;
# it runs from the repository root, so relative paths are relative to that.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-build-deps.sh
exec cargo run --release --bin fencegate -- dev "$@"
