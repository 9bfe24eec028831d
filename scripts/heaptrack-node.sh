#!/usr/bin/env bash
# A `--fencegate-bin` for the load harness that runs one node under heaptrack, so a heap
# profile of a node under the seed workload can be taken with the harness's own scenarios:
#
#   cargo build --release -p proxy --bin fencegate --no-default-features   # system allocator
#   cp target/release/fencegate /tmp/fencegate-sysalloc
#   FENCEGATE_HEAPTRACK_BIN=/tmp/fencegate-sysalloc \
#     target/release/fencegate-loadtest run --profile seed --scenario replica-down \
#     --duration-s 300 --leader-only --fencegate-bin scripts/heaptrack-node.sh --out /tmp/run
#   heaptrack_print -f /tmp/heaptrack/node1.PID.zst --flamegraph-cost-type peak -F stacks.txt
#
# heaptrack only sees allocations that go through malloc, hence the build without mimalloc.
# The node keeps this script's pid (the preload library is set and the binary exec'd, instead
# of running it under the heaptrack launcher), so the harness's signals reach it.
#   FENCEGATE_HEAPTRACK_BIN   the fencegate binary to run (required)
#   FENCEGATE_HEAPTRACK_NODE  which node id to profile (default 1); the others run plainly
#   FENCEGATE_HEAPTRACK_OUT   where profiles go (default /tmp/heaptrack)
set -euo pipefail

bin=${FENCEGATE_HEAPTRACK_BIN:?set FENCEGATE_HEAPTRACK_BIN to a fencegate built with --no-default-features}
node=${FENCEGATE_HEAPTRACK_NODE:-1}
out=${FENCEGATE_HEAPTRACK_OUT:-/tmp/heaptrack}
lib=/usr/lib/heaptrack

if [ "${1:-}" = node ] && [[ "${3:-}" == */node"$node".toml ]]; then
    mkdir -p "$out"
    pipe="$out/pipe.$$"
    rm -f "$pipe"
    mkfifo "$pipe"
    "$lib/libexec/heaptrack_interpret" <"$pipe" | zstd -q -c >"$out/node$node.$$.zst" &
    LD_PRELOAD="$lib/libheaptrack_preload.so" DUMP_HEAPTRACK_OUTPUT="$pipe" exec "$bin" "$@"
fi
exec "$bin" "$@"
