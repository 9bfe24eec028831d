#!/usr/bin/env bash
# Fencing proxy (admitted token, fast path) vs nginx pass-through vs the upstream directly:
# the same upstream (the bundled demo store), the same load generator (wrk), one run each.
#
#   proxy/bench/proxy-vs-nginx.sh [DURATION_S] [CONNECTIONS]
#
# Needs Debian's nginx and wrk (installed if missing). Everything binds 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-15}
CONNS=${2:-32}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null; sleep 1; rm -rf "$WORK"' EXIT

command -v nginx >/dev/null && command -v wrk >/dev/null || {
    apt-get update && apt-get install -y --no-install-recommends nginx wrk
}
cargo build --release -p proxy --bin fencegate

# Ports away from the dev defaults so a running `fencegate dev` does not interfere.
./target/release/fencegate dev --data-dir "$WORK/data" --api-ports 17001,17002,17003 \
    --proxy-ports 18001,18002,18003 --demo-store-port 19000 >"$WORK/dev.log" 2>&1 &
for _ in $(seq 100); do curl -sf localhost:17001/readyz >/dev/null && break; sleep 0.1; done

cat >"$WORK/nginx.conf" <<NGINX
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    upstream store { server 127.0.0.1:19000; keepalive 64; }
    server {
        listen 127.0.0.1:18090;
        location / {
            proxy_pass http://store;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
nginx -c "$WORK/nginx.conf" -p "$WORK"

TOKEN=$(curl -s -XPOST localhost:17001/v1/locks/kv:bench/acquire \
    -d '{"request_id":"bench","ttl_ms":300000}' | sed -E 's/.*"fencing_token":([0-9]+).*/\1/')
echo "token: $TOKEN"
# One admitted write first, so the measured run is the fast path.
curl -sf -XPUT localhost:18001/kv/bench -H "Fence-Token: $TOKEN" -d warmup >/dev/null

run() {
    local name=$1 url=$2
    echo "== $name: $url"
    FENCE_TOKEN=$TOKEN wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s proxy/bench/put.lua "$url" \
        | tee "$WORK/$name.txt" | grep -E "Requests/sec|Latency |50%|90%|99%|Non-2xx|Socket errors"
}
run direct "http://127.0.0.1:19000/kv/bench"
run nginx "http://127.0.0.1:18090/kv/bench"
run fencing-proxy "http://127.0.0.1:18001/kv/bench"
echo "== fencing decisions on node 1:"
curl -s localhost:17001/metrics | grep -E '^fencegate_proxy_fence_decisions_total' || true
