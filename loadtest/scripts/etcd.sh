#!/usr/bin/env bash
# A local 3-member etcd cluster for the load harness's comparison runs, on 127.0.0.1 only.
#
#   etcd.sh install                         install Debian's etcd-server and etcd-client if missing
#   etcd.sh start DIR C1,C2,C3 P1,P2,P3     start members m1..m3 (client ports C, peer ports P),
#                                           data in DIR/mN, logs in DIR/mN.log, pids in DIR/mN.pid;
#                                           waits (at most 60 s) until every member is healthy
#   etcd.sh stop DIR                        stop every member started in DIR (SIGTERM, then SIGKILL)
#   etcd.sh stop-member DIR N               stop member N only
#
# With ETCD_SH_OWNER_PID set, `start` also leaves a watcher that stops the members when that
# process is gone, so a harness killed outright (SIGKILL, no clean-up) takes them with it.
#
# Durability is etcd's default (WAL fsync on every commit), as for fencegate.
set -euo pipefail

cmd=${1:-}
install() {
    if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server etcd-client
    fi
    # Debian may start a system etcd on install (where there is an init system); the harness
    # never uses it, so make sure it does not hold ports or CPU.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
        systemctl stop etcd || true
    fi
}

stop_pid() {
    local pidfile=$1
    [ -f "$pidfile" ] || return 0
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

case "$cmd" in
install)
    install
    ;;
start)
    dir=${2:?DIR}
    IFS=, read -r -a cports <<<"${3:?client ports}"
    IFS=, read -r -a pports <<<"${4:?peer ports}"
    [ "${#cports[@]}" -eq 3 ] && [ "${#pports[@]}" -eq 3 ] || { echo "need 3 client and 3 peer ports" >&2; exit 2; }
    install
    mkdir -p "$dir"
    initial=""
    for i in 0 1 2; do
        initial="${initial:+$initial,}m$((i + 1))=http://127.0.0.1:${pports[$i]}"
    done
    for i in 0 1 2; do
        n=$((i + 1))
        nohup etcd --name "m$n" --data-dir "$dir/m$n" \
            --listen-client-urls "http://127.0.0.1:${cports[$i]}" \
            --advertise-client-urls "http://127.0.0.1:${cports[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${pports[$i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${pports[$i]}" \
            --initial-cluster "$initial" --initial-cluster-state new \
            --initial-cluster-token "fencegate-loadtest" \
            --log-level warn >"$dir/m$n.log" 2>&1 </dev/null &
        echo $! >"$dir/m$n.pid"
    done
    if [ -n "${ETCD_SH_OWNER_PID:-}" ]; then
        nohup bash "$0" watch-owner "$dir" "$ETCD_SH_OWNER_PID" >/dev/null 2>&1 </dev/null &
    fi
    endpoints=""
    for i in 0 1 2; do
        endpoints="${endpoints:+$endpoints,}http://127.0.0.1:${cports[$i]}"
    done
    # 60 s in all: each check is bounded too (etcdctl's own timeouts would let 150 failed
    # checks take some 13 minutes).
    deadline=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --dial-timeout=1s --command-timeout=2s \
            endpoint health >/dev/null 2>&1; then
            echo "$endpoints"
            exit 0
        fi
        sleep 0.2
    done
    echo "etcd cluster in $dir did not become healthy within 60 s; see $dir/m*.log" >&2
    exit 1
    ;;
stop)
    dir=${2:?DIR}
    for n in 1 2 3; do stop_pid "$dir/m$n.pid"; done
    ;;
stop-member)
    dir=${2:?DIR}
    stop_pid "$dir/m${3:?N}.pid"
    ;;
watch-owner)
    # Internal (see ETCD_SH_OWNER_PID): ends by itself once every member was stopped.
    dir=${2:?DIR}
    owner=${3:?PID}
    while kill -0 "$owner" 2>/dev/null; do
        compgen -G "$dir/m[123].pid" >/dev/null || exit 0
        sleep 1
    done
    for n in 1 2 3; do stop_pid "$dir/m$n.pid"; done
    ;;
*)
    echo "usage: $0 install | start DIR C1,C2,C3 P1,P2,P3 | stop DIR | stop-member DIR N" >&2
    exit 2
    ;;
esac
