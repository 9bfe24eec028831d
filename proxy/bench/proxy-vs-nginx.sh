#!/usr/bin/env bash
# The fencing proxy against nginx pass-through and the upstream directly, in one run, with the
# same upstream (the bundled demo store's `/sink/...`, which reads the body and answers 200)
# and the same load generator flags (wrk):
#
#   direct      wrk -> demo store
#   nginx       wrk -> nginx (2 workers, upstream keepalive) -> demo store
#   fenced      wrk -> the proxy of `fencegate node` 1 (of 3) -> demo store, PUT with an
#               admitted Fence-Token (the fast path: no consensus round trip per request)
#   passthrough wrk -> the same proxy, a route with no protected methods (fencing off) -> the
#               same store handler
#
# each with 1 KiB and 64 KiB bodies and 32 and 256 connections, plus the CPU seconds the
# serving process (store, nginx master+workers, node) used per 10k requests, from
# /proc/<pid>/stat before and after each cell. Prints a markdown table.
#
#   proxy/bench/proxy-vs-nginx.sh [SECONDS_PER_CELL] [CONNECTIONS...]
#   e.g. proxy/bench/proxy-vs-nginx.sh 8 32 256      (the default; ~2.5 min of load)
#
# Environment:
#   BODIES="1024 65536"   body sizes
#   TARGETS="direct nginx fenced passthrough"
#   FENCEGATE_BIN=path    run that binary instead of building one (to compare two builds);
#   STORE_BIN=path        the demo store from another binary (default: FENCEGATE_BIN)
#   PERF=1 / STRACE=1     `perf record -g` / `strace -c -f` the serving process of each
#                         target in PROFILE_TARGETS (default "fenced") during its cells; the
#                         work directory is kept and its path printed
# Needs Debian's nginx and wrk (installed if missing). Everything binds 127.0.0.1 only; the
# ports are away from `fencegate dev`'s defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_CELL=${1:-8}
shift || true
CONNS=${*:-32 256}
BODIES=${BODIES:-1024 65536}
WORK=$(mktemp -d)
TARGETS=${TARGETS:-direct nginx fenced passthrough}
PROFILE_TARGETS=${PROFILE_TARGETS:-fenced}
BIN=${FENCEGATE_BIN:-./target/release/fencegate}
STORE_BIN=${STORE_BIN:-$BIN}

cleanup() {
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    if [ "${PERF:-0}${STRACE:-0}" != 00 ]; then echo "# profiles kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

command -v nginx >/dev/null && command -v wrk >/dev/null || {
    apt-get update && apt-get install -y --no-install-recommends nginx wrk
}
[ -n "${FENCEGATE_BIN:-}" ] || cargo build --release -p proxy --bin fencegate

STORE=127.0.0.1:19100
NGINX=127.0.0.1:18190
"$STORE_BIN" demo-store --listen "$STORE" >"$WORK/store.log" 2>&1 &
STORE_PID=$!

# Three `fencegate node` processes; each proxy fences /sink/fenced/{key} as bench:{key} and
# passes /sink/open/{key} through unfenced.
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
for id in 1 2 3; do
    cat >"$WORK/node$id.toml" <<TOML
listen = "127.0.0.1:1710$id"
peer_listen = "127.0.0.1:1720$id"
[node]
id = $id
data_dir = "$WORK/data$id"
peer_secret = "$SECRET"
auth = "off"
[node.initial_members]
"1" = { api = "127.0.0.1:17101", peer = "127.0.0.1:17201" }
"2" = { api = "127.0.0.1:17102", peer = "127.0.0.1:17202" }
"3" = { api = "127.0.0.1:17103", peer = "127.0.0.1:17203" }
[proxy]
listen = "127.0.0.1:1810$id"
[[proxy.routes]]
path = "/sink/fenced/{key}"
resource = "bench:{key}"
upstream = "$STORE"
[[proxy.routes]]
path = "/sink/open/{key}"
resource = "sink:{key}"
upstream = "$STORE"
protected_methods = []
TOML
    "$BIN" --log-level warn node --config "$WORK/node$id.toml" >"$WORK/node$id.log" 2>&1 &
    eval "NODE${id}_PID=$!"
done
for _ in $(seq 300); do curl -sf localhost:17101/readyz >/dev/null && break; sleep 0.1; done

cat >"$WORK/nginx.conf" <<NGINX
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_buffer_size 128k;
    upstream store { server $STORE; keepalive 64; }
    server {
        listen $NGINX;
        location / {
            proxy_pass http://store;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
nginx -c "$WORK/nginx.conf" -p "$WORK"
for _ in $(seq 50); do [ -s "$WORK/nginx.pid" ] && break; sleep 0.1; done
NGINX_PID=$(cat "$WORK/nginx.pid")

TOKEN=$(curl -sf -XPOST localhost:17101/v1/locks/bench:bench/acquire \
    -d '{"request_id":"bench","ttl_ms":300000}' | sed -E 's/.*"fencing_token":([0-9]+).*/\1/')
# One admitted write first, so the measured cells are the fast path.
curl -sf -XPUT localhost:18101/sink/fenced/bench -H "Fence-Token: $TOKEN" -d warmup >/dev/null

TICKS=$(getconf CLK_TCK)
# utime+stime of a process and its children's threads (nginx: master and workers), in ticks.
cpu_ticks() {
    local total=0 pid
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}
pids_of() {
    case $1 in
        direct) echo "$STORE_PID" ;;
        nginx) echo "$NGINX_PID $(pgrep -P "$NGINX_PID" | tr '\n' ' ')" ;;
        fenced) echo "$NODE1_PID" ;;
        passthrough) echo "$NODE1_PID" ;;
    esac
}
url_of() {
    case $1 in
        direct) echo "http://$STORE/sink/fenced/bench" ;;
        nginx) echo "http://$NGINX/sink/fenced/bench" ;;
        fenced) echo "http://127.0.0.1:18101/sink/fenced/bench" ;;
        passthrough) echo "http://127.0.0.1:18101/sink/open/bench" ;;
    esac
}

echo "# proxy benchmark $(date -u +%FT%TZ), $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# wrk -t2 -c<conns> -d${SECONDS_PER_CELL}s --latency -s proxy/bench/put.lua, token $TOKEN"
echo
echo "| target | body | conns | req/s | p50 | p99 | errors | CPU s / 10k req | req/s vs nginx |"
echo "|---|---|---|---|---|---|---|---|---|"
for body in $BODIES; do
    for conns in $CONNS; do
        nginx_rps=
        for target in $TARGETS; do
            pids=$(pids_of $target)
            before=$(cpu_ticks $pids)
            perf_pid=
            profiled=$(echo " $PROFILE_TARGETS " | grep -q " $target " && echo "${pids%% *}" || true)
            if [ "${PERF:-0}" = 1 ] && [ -n "$profiled" ]; then
                perf record -g -F 499 -p "$profiled" -o "$WORK/perf-$target-$body-$conns.data" \
                    -- sleep "$SECONDS_PER_CELL" >/dev/null 2>&1 &
                perf_pid=$!
            elif [ "${STRACE:-0}" = 1 ] && [ -n "$profiled" ]; then
                timeout -s INT "$SECONDS_PER_CELL" strace -c -f -p "$profiled" \
                    -o "$WORK/strace-$target-$body-$conns.txt" >/dev/null 2>&1 &
                perf_pid=$!
            fi
            out=$(FENCE_TOKEN=$TOKEN BODY_BYTES=$body wrk -t2 -c"$conns" -d"${SECONDS_PER_CELL}s" \
                --latency -s proxy/bench/put.lua "$(url_of $target)")
            [ -n "$perf_pid" ] && wait "$perf_pid" || true
            after=$(cpu_ticks $pids)
            echo "$out" >"$WORK/$target-$body-$conns.txt"
            rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%.0f", $2}')
            reqs=$(echo "$out" | awk '/requests in/ {print $1}')
            p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
            p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
            errors=$(echo "$out" | awk '/Non-2xx/ {n += $NF} /Socket errors/ {for (i = 4; i <= NF; i += 2) n += $i} END {print n + 0}')
            cpu=$(awk -v d=$((after - before)) -v t="$TICKS" -v r="$reqs" \
                'BEGIN {if (r > 0) printf "%.2f", d / t / r * 10000; else print "-"}')
            [ $target = nginx ] && nginx_rps=$rps
            ratio=$(awk -v a="$rps" -v b="${nginx_rps:-0}" 'BEGIN {if (b > 0) printf "%.2f×", a / b; else print "-"}')
            [ $target = direct ] && ratio="-"
            echo "| $target | $body | $conns | $rps | $p50 | $p99 | $errors | $cpu | $ratio |"
        done
    done
done
echo
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
curl -s localhost:17101/metrics | grep -E '^fencegate_proxy_fence_decisions_total' | sed 's/^/# /' || true
