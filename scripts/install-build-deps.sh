#!/usr/bin/env bash
# Makes sure the system packages the build needs are present; a fresh machine with only the
# Rust toolchain lacks them:
#   cmake              pingora builds zlib-ng with it
#   protobuf-compiler  the load harness's etcd driver compiles etcd's protos with protoc...
#   libprotobuf-dev    ...which import the well-known .proto files
# With --tests, also what the test suite needs beyond the build (`.ci/run` passes it):
#   chromium, chromium-driver  the admin UI's tests drive a real headless browser over WebDriver
# Installs what is missing with apt-get as root (or through sudo); otherwise says what to
# install and exits non-zero, before cargo fails halfway through a long build.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
if [ "${1:-}" = "--tests" ]; then
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

install=(apt-get install -y --no-install-recommends "${missing[@]}")
if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing build dependencies (Debian package names): ${missing[*]}" >&2
    echo "install them with your system's package manager, then run this again" >&2
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "missing build dependencies: ${missing[*]}" >&2
    echo "install them as root, then run this again:" >&2
    echo "  apt-get update && ${install[*]}" >&2
    exit 1
fi

echo "installing build dependencies: ${missing[*]}" >&2
# `${as_root[@]+...}`: an empty array is "unbound" to `set -u` in bash before 4.4.
${as_root[@]+"${as_root[@]}"} apt-get update
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive "${install[@]}"
