#!/usr/bin/env bash
# A 3-node control quorum (and optionally the proxy) on this machine, from the files beside
# this script. Loopback ports 17001-17003 (control) and 18080 (proxy).
#
#   deploy/local/quorum.sh start [DIR]   start three nodes, form the cluster, print its status
#   deploy/local/quorum.sh proxy [DIR]   start the proxy recording on the quorum; prints the
#                                        execution's base URLs
#   deploy/local/quorum.sh status        every node's view
#   deploy/local/quorum.sh stop [DIR]    SIGTERM everything started from DIR, wait for it
#
# DIR (default ./gyre-local) holds each node's data dir, logs and pid files. Starting again on
# the same DIR restarts the nodes on their data: nothing committed is lost. `GYRE` names the
# binary (default: `gyre` on PATH). `GYRE_PORT_BASE=B` moves the ports to B+1..B+3 (control)
# and B+10 (proxy), overriding the files' addresses, for a second quorum on one machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gyre=${GYRE:-gyre}
command=${1:-}
dir=${2:-./gyre-local}
base=${GYRE_PORT_BASE:-17000}
proxy_port=$((base == 17000 ? 18080 : base + 10))
nodes=1=127.0.0.1:$((base + 1)),2=127.0.0.1:$((base + 2)),3=127.0.0.1:$((base + 3))
cluster=127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2)),127.0.0.1:$((base + 3))

# Waits (up to 30 s) until FILE has a line matching PATTERN or PID has exited.
wait_for_line() {
  local file=$1 pattern=$2 pid=$3
  for _ in $(seq 300); do
    if grep -q "$pattern" "$file" 2>/dev/null; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "process $pid exited; its output:" >&2
      cat "$file" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "timed out waiting for '$pattern' in $file" >&2
  return 1
}

case "$command" in
start)
  mkdir -p "$dir"
  for id in 1 2 3; do
    if [ -f "$dir/node-$id.pid" ] && kill -0 "$(cat "$dir/node-$id.pid")" 2>/dev/null; then
      echo "node $id of $dir is already running (pid $(cat "$dir/node-$id.pid")); stop it first" >&2
      exit 1
    fi
  done
  for id in 1 2 3; do
    "$gyre" control run --config "$here/control-$id.toml" --data-dir "$dir/node-$id" \
      --listen "127.0.0.1:$((base + id))" --peers "$nodes" > "$dir/node-$id.log" 2>&1 &
    echo $! > "$dir/node-$id.pid"
  done
  for id in 1 2 3; do
    wait_for_line "$dir/node-$id.log" "serving node $id" "$(cat "$dir/node-$id.pid")"
  done
  "$gyre" control init --nodes "$nodes"
  "$gyre" control status --cluster "$cluster"
  ;;
proxy)
  mkdir -p "$dir"
  if [ -f "$dir/proxy.pid" ] && kill -0 "$(cat "$dir/proxy.pid")" 2>/dev/null; then
    echo "the proxy of $dir is already running (pid $(cat "$dir/proxy.pid")); stop it first" >&2
    exit 1
  fi
  "$gyre" proxy --config "$here/proxy.toml" --credentials "$dir/proxy.credentials" \
    --listen "127.0.0.1:$proxy_port" --cluster "$cluster" > "$dir/proxy.out" 2> "$dir/proxy.log" &
  echo $! > "$dir/proxy.pid"
  wait_for_line "$dir/proxy.out" '"anthropic_base_url"' "$(cat "$dir/proxy.pid")"
  cat "$dir/proxy.out"
  ;;
status)
  "$gyre" control status --cluster "$cluster"
  ;;
stop)
  for name in proxy node-1 node-2 node-3; do
    pid_file="$dir/$name.pid"
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    if kill -TERM "$pid" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "$name ($pid) did not stop within 10 s after SIGTERM" >&2
        exit 1
      fi
    fi
    rm -f "$pid_file"
  done
  ;;
*)
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
