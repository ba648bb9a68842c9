#!/usr/bin/env bash
# Per-request cost of one agent-reach sidecar pair (or an nginx pair), measured in ways that do
# not depend on how busy the machine is:
#   callgrind  instructions per request in each sidecar (user space; valgrind serialises threads),
#              and the locked instructions and clock reads among them (benches/perf/locked.py);
#              with CG_ARGS=--cache-sim=yes, simulated cache misses per request too
#   perf       context switches (and how many were voluntary), task-clock, user/system CPU and
#              peak RSS per request (perf stat -p, /proc)
#   strace     syscalls per request (strace -c -f -p)
#   wall       plain wrk throughput (noisy while others compile)
#   order      every function the pair runs, from start-up, into $OUT for
#              benches/perf/hot_text.py (docs/development.md#hot-text)
#
# Topology as in benches/proxies.rs: wrk (1 thread) → front → back → upstream (nginx `return
# 200`, 128 bytes, its own process so it is never counted).
#
# Usage: benches/perf/hop.sh MODE [conns] [seconds]
#   MODE: callgrind | order | perf | strace | record | wall
#         | nginx-callgrind | nginx-perf | nginx-strace | nginx-record
#         | floor-callgrind | floor-perf | floor-strace | floor-record   (FLOOR_BIN as the pair)
#   BIN=/path/to/agent-reach  (default: $CARGO_TARGET_DIR/dist/agent-reach, the image's build:
#                               `cargo build --profile dist --bin agent-reach`)
#   GUARD="50000 45000"        (callgrind: the caller's and the callee's most instructions a
#                               request; past either the run fails, exit 3)
#   OUT=dir                    (where callgrind.out files and logs go; default /tmp/hop-perf)
#   WORKERS=1                  (--worker-threads for each sidecar)
#   UPSTREAM_BIN=path          (the upstream: `cargo build --release --example perf_upstream`)
#   PEER_PROTOCOL=http1|http2  (the front's policy `pool.peer_protocol`; default http1)
#   MTLS=1                     (strict mutual TLS between the two, `agent-reach dev-certs`)
#   FLOOR_BIN=path             (floor-* modes: target/floor/release/hop-by-hand or hop-on-hyper,
#                               built from benches/perf/floor/Cargo.toml as its header says)
#   FLOOR_ARGS=typed           (hop-by-hand through the `http` crate's types)
#   WRK_TIMEOUT=2s             (wrk's own; under callgrind at 64 conns a request can take longer,
#                               and one wrk gives up on is served but not counted)
set -uo pipefail

MODE=${1:?mode}
CONNS=${2:-16}
SECS=${3:-5}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/dist/agent-reach}
read -r GUARD_CALLER GUARD_CALLEE <<<"${GUARD:-50000 45000}"
OVER=0
OUT=${OUT:-/tmp/hop-perf}
WORKERS=${WORKERS:-1}
mkdir -p "$OUT"
DIR=$(mktemp -d /tmp/hop-perf.XXXXXX)
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$DIR"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
    for _ in $(seq 1 400); do
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    return 1
}

nginx_conf() { # tag listen upstream-addr|return [main-context directives]
    local p="$DIR/nginx-$1"
    mkdir -p "$p/logs"
    local loc
    if [ "$3" = return ]; then
        loc="location / { return 200 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'; }"
        ups=""
    else
        loc="location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; proxy_request_buffering off; }"
        ups="upstream up { server $3; keepalive 256; }"
    fi
    cat >"$p/nginx.conf" <<EOF
worker_processes 1;
daemon off;
${4:-}
pid $p/nginx.pid;
error_log $p/logs/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $p/body;
  proxy_temp_path $p/proxy;
  keepalive_requests 1000000;
  $ups
  server { listen 127.0.0.1:$2; client_max_body_size 1m; $loc }
}
EOF
    echo "$p"
}

start_nginx() { # prefix [wrapper...]: started in the background, its pid last in PIDS
    local p=$1
    shift
    "$@" nginx -p "$p" -c "$p/nginx.conf" -e "$p/logs/error.log" >/dev/null 2>&1 &
    PIDS+=($!)
}

worker_of() { # nginx master pid -> worker pid
    for _ in $(seq 1 100); do
        local w
        w=$(pgrep -P "$1" | head -1)
        if [ -n "$w" ]; then echo "$w"; return; fi
        sleep 0.05
    done
}

UP=$(port)
# The same minimal hyper upstream as benches/proxies.rs (no `Connection` header in responses);
# UPSTREAM=nginx uses an nginx `return 200` instead.
if [ "${UPSTREAM:-hyper}" = nginx ]; then
    start_nginx "$(nginx_conf up "$UP" return)"
else
    UPSTREAM_BIN=${UPSTREAM_BIN:-$(dirname "$BIN")/examples/perf_upstream}
    if [ ! -x "$UPSTREAM_BIN" ]; then
        echo "no upstream at $UPSTREAM_BIN: cargo build --release --example perf_upstream, or UPSTREAM=nginx" >&2
        exit 2
    fi
    "$UPSTREAM_BIN" "$UP" &
    PIDS+=($!)
fi
# Without an upstream every request would fail, and the figures would be of errors.
wait_port "$UP" || exit 1

FRONT=$(port)
BACK=$(port)
WRAP=()
case $MODE in
    # Instruction addresses too: benches/perf/locked.py finds the locked ones among them.
    # CG_ARGS: more of callgrind's options, e.g. "--cache-sim=yes" for simulated cache misses.
    callgrind|nginx-callgrind|floor-callgrind)
        WRAP=(valgrind --tool=callgrind --instr-atstart=no --dump-instr=yes ${CG_ARGS:-}
              --callgrind-out-file="$OUT/callgrind.%q{ROLE}.out") ;;
    # Every function either sidecar runs, from its first instruction: start-up, the request
    # path, the admin pages and a scrape. Symbol names stay mangled for the linker.
    order) WRAP=(valgrind --tool=callgrind --demangle=no --dump-instr=no
                 --callgrind-out-file="$OUT/order.%q{ROLE}.out") ;;
esac

if [[ $MODE == floor-* ]]; then
    # A measuring stick as the pair (benches/perf/floor; docs/perf-levers.md, "The floor under a hop").
    if [ ! -x "${FLOOR_BIN:-}" ]; then
        echo "FLOOR_BIN must name a built floor: cargo build --release --locked --manifest-path benches/perf/floor/Cargo.toml --target-dir target/floor" >&2
        exit 2
    fi
    ROLE=back "${WRAP[@]}" "$FLOOR_BIN" "127.0.0.1:$BACK" "127.0.0.1:$UP" ${FLOOR_ARGS:-} >/dev/null 2>&1 &
    BACK_PID=$!; PIDS+=($BACK_PID)
    ROLE=front "${WRAP[@]}" "$FLOOR_BIN" "127.0.0.1:$FRONT" "127.0.0.1:$BACK" ${FLOOR_ARGS:-} >/dev/null 2>&1 &
    FRONT_PID=$!; PIDS+=($FRONT_PID)
elif [[ $MODE == nginx-callgrind ]]; then
    # No master: valgrind then wraps the process that serves.
    export ROLE=back
    start_nginx "$(nginx_conf back "$BACK" "127.0.0.1:$UP" "master_process off;")" "${WRAP[@]}"; BACK_PID=${PIDS[-1]}
    export ROLE=front
    start_nginx "$(nginx_conf front "$FRONT" "127.0.0.1:$BACK" "master_process off;")" "${WRAP[@]}"; FRONT_PID=${PIDS[-1]}
elif [[ $MODE == nginx-* ]]; then
    start_nginx "$(nginx_conf back "$BACK" "127.0.0.1:$UP")"; BACK_PID=$(worker_of "${PIDS[-1]}")
    start_nginx "$(nginx_conf front "$FRONT" "127.0.0.1:$BACK")"; FRONT_PID=$(worker_of "${PIDS[-1]}")
else
    BACK_ADMIN=$(port)
    FRONT_ADMIN=$(port)
    BACK_TLS=""; FRONT_TLS=""; BACK_ID=""; MODE_MTLS=""
    if [ "${MTLS:-0}" = 1 ]; then
        "$BIN" dev-certs --out "$DIR/certs" front back >/dev/null
        tls() { echo "tls: { cert: $DIR/certs/$1/tls.crt, key: $DIR/certs/$1/tls.key, ca: $DIR/certs/$1/ca.crt }"; }
        BACK_TLS=$(tls back); FRONT_TLS=$(tls front)
        BACK_ID=', identity: "spiffe://dev.local/ns/default/sa/back"'
        MODE_MTLS="mtls: { mode: strict }"
    fi
    cat >"$DIR/back.yaml" <<EOF
listen: { outbound: 127.0.0.1:$(port), inbound: 127.0.0.1:$BACK, admin: 127.0.0.1:$BACK_ADMIN }
agent: { name: back, address: 127.0.0.1:$UP, max_concurrency: 4096, queue: { capacity: 4096 },
  capabilities: [ { name: bench } ] }
$BACK_TLS
EOF
    echo "$MODE_MTLS" >"$DIR/back-policy.yaml"
    cat >"$DIR/front.yaml" <<EOF
listen: { outbound: 127.0.0.1:$FRONT, inbound: 127.0.0.1:$(port), admin: 127.0.0.1:$FRONT_ADMIN }
agent: { name: front, address: 127.0.0.1:9, max_concurrency: 1 }
peers: [ { name: back, address: 127.0.0.1:$BACK, capabilities: [bench]$BACK_ID } ]
$FRONT_TLS
EOF
    ROLE=back "${WRAP[@]}" "$BIN" run --worker-threads "$WORKERS" --log error --config "$DIR/back.yaml" \
        --policy "$DIR/back-policy.yaml" >/dev/null 2>"$OUT/back.log" &
    BACK_PID=$!; PIDS+=($BACK_PID)
    printf 'pool: { peer_protocol: %s }\n%s\n' "${PEER_PROTOCOL:-http1}" "$MODE_MTLS" >"$DIR/front-policy.yaml"
    # Under valgrind the back accepts slowly: a burst of connects must not time out (and eject
    # it) during the warm-up.
    [[ $MODE == callgrind || $MODE == order ]] && echo "timeouts: { connect: 30s, request: 60s }" >>"$DIR/front-policy.yaml"
    ROLE=front "${WRAP[@]}" "$BIN" run --worker-threads "$WORKERS" --log error --config "$DIR/front.yaml" \
        --policy "$DIR/front-policy.yaml" \
        >/dev/null 2>"$OUT/front.log" &
    FRONT_PID=$!; PIDS+=($FRONT_PID)
fi
wait_port "$BACK"
wait_port "$FRONT"

cat >"$DIR/report.lua" <<'EOF'
wrk.headers["reach-capability"] = "bench"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
EOF
load() { # seconds -> "requests duration_us errors p50 p99 p999"
    wrk -t1 -c"$CONNS" -d"$1"s --timeout "${WRK_TIMEOUT:-2s}" -s "$DIR/report.lua" "http://127.0.0.1:$FRONT/" | awk '/^RESULT/ {print $2,$3,$4,$5,$6,$7}'
}

# Warm up: connections pooled, first-use registrations done.
load 2 >/dev/null

switches() { # pid -> "voluntary nonvoluntary" context switches, all threads
    cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt/{v+=$2} /^nonvoluntary_ctxt/{n+=$2} END{print v+0, n+0}'
}

ticks() { # pid -> "utime stime" in clock ticks (all threads)
    awk '{sub(/.*\) /, ""); print $12, $13}' /proc/"$1"/stat
}

per() { python3 -c "import sys; print(f'{float(sys.argv[1])/max(float(sys.argv[2]),1):.3f}')" "$1" "$2"; }

case $MODE in
    callgrind|nginx-callgrind|floor-callgrind)
        callgrind_control -i on "$BACK_PID" >/dev/null; callgrind_control -i on "$FRONT_PID" >/dev/null
        load 1 >/dev/null
        callgrind_control -z "$BACK_PID" >/dev/null; callgrind_control -z "$FRONT_PID" >/dev/null
        read -r N DUR ERR P50 P99 P999 < <(load "$SECS")
        callgrind_control -i off "$BACK_PID" >/dev/null; callgrind_control -i off "$FRONT_PID" >/dev/null
        callgrind_control -d "$BACK_PID" >/dev/null; callgrind_control -d "$FRONT_PID" >/dev/null
        sleep 1
        echo "requests=$N errors=$ERR conns=$CONNS peer_protocol=${PEER_PROTOCOL:-http1}"
        for role in front back; do
            f=$(ls -t "$OUT"/callgrind."$role".out* 2>/dev/null | head -1)
            ir=$(grep -h '^summary:\|^totals:' "$f" | tail -1 | awk '{print $2}')
            perreq=$(per "$ir" "$N")
            limit=$GUARD_CALLER; [ $role = back ] && limit=$GUARD_CALLEE
            verdict=""
            if [[ $MODE == callgrind ]]; then
                if python3 -c "import sys; sys.exit(0 if float('$perreq') <= $limit else 1)"; then
                    verdict="(guard $limit: ok)"
                else
                    verdict="(guard $limit: OVER)"
                    OVER=1
                fi
            fi
            echo "$role Ir=$ir Ir/req=$perreq $verdict file=$f"
            # Simulated misses: instruction fetches (I1) and data reads and writes (D1) that
            # missed the first-level caches.
            if grep -q '^events:.*I1mr' "$f"; then
                python3 - "$f" "$N" "$role" <<'PY'
import sys
f, n, role = sys.argv[1], float(sys.argv[2]), sys.argv[3]
lines = open(f).read().splitlines()
events = next(l for l in lines if l.startswith("events:")).split()[1:]
totals = [int(x) for x in next(l for l in reversed(lines) if l.startswith("totals:")).split()[1:]]
t = dict(zip(events, totals))
print(f"{role} cache misses/req: I1 {t['I1mr']/n:.1f}, D1 read {t['D1mr']/n:.1f}, D1 write {t['D1mw']/n:.1f}")
PY
            fi
            # nginx's binary names no functions to place its locked instructions by.
            [[ $MODE == callgrind ]] && echo "$role $(python3 "$(dirname "$0")/locked.py" "$f" "$BIN" "$N" 0 | sed -n 1p)"
        done
        ;;
    perf|nginx-perf|floor-perf)
        perf stat -x, -e context-switches,cpu-migrations,task-clock,page-faults -p "$FRONT_PID" -o "$DIR/front.stat" &
        PF=$!
        perf stat -x, -e context-switches,cpu-migrations,task-clock,page-faults -p "$BACK_PID" -o "$DIR/back.stat" &
        PB=$!
        sleep 0.3
        T0F=$(ticks "$FRONT_PID"); T0B=$(ticks "$BACK_PID")
        C0F=$(switches "$FRONT_PID"); C0B=$(switches "$BACK_PID")
        read -r N DUR ERR P50 P99 P999 < <(load "$SECS")
        T1F=$(ticks "$FRONT_PID"); T1B=$(ticks "$BACK_PID")
        C1F=$(switches "$FRONT_PID"); C1B=$(switches "$BACK_PID")
        kill -INT $PF $PB; wait $PF $PB 2>/dev/null
        rps=$(python3 -c "print(round($N/($DUR/1e6)))")
        echo "requests=$N rps=$rps errors=$ERR p50=${P50}us p99=${P99}us p999=${P999}us conns=$CONNS peer_protocol=${PEER_PROTOCOL:-http1}"
        for role in front back; do
            cs=$(awk -F, '$3=="context-switches"{print $1}' "$DIR/$role.stat")
            mig=$(awk -F, '$3=="cpu-migrations"{print $1}' "$DIR/$role.stat")
            clk=$(awk -F, '$3=="task-clock"{print $1}' "$DIR/$role.stat")
            pf=$(awk -F, '$3=="page-faults"{print $1}' "$DIR/$role.stat")
            if [ $role = front ]; then t0=$T0F; t1=$T1F; else t0=$T0B; t1=$T1B; fi
            read -r u0 s0 <<<"$t0"; read -r u1 s1 <<<"$t1"
            if [ $role = front ]; then c0=$C0F; c1=$C1F; else c0=$C0B; c1=$C1B; fi
            read -r v0 n0 <<<"$c0"; read -r v1 n1 <<<"$c1"
            pid=$FRONT_PID; [ $role = back ] && pid=$BACK_PID
            rss=$(awk '/VmHWM/{printf "peak_rss=%.1fMiB", $2/1024}' /proc/$pid/status)
            echo "$role $rss cs/req=$(per "$cs" "$N") (voluntary $(per $((v1-v0)) "$N"), involuntary $(per $((n1-n0)) "$N")) migrations/req=$(per "$mig" "$N") faults/req=$(per "$pf" "$N") cpu_us/req=$(per "$(python3 -c "print($clk*1000)")" "$N") user_us/req=$(per $(( (u1-u0)*10000 )) "$N") sys_us/req=$(per $(( (s1-s0)*10000 )) "$N")"
        done
        ;;
    strace|nginx-strace|floor-strace)
        strace -c -f -p "$FRONT_PID" -o "$DIR/front.strace" &
        SF=$!
        strace -c -f -p "$BACK_PID" -o "$DIR/back.strace" &
        SB=$!
        sleep 0.5
        read -r N DUR ERR P50 P99 P999 < <(load "$SECS")
        kill -INT $SF $SB; wait $SF $SB 2>/dev/null
        echo "requests=$N errors=$ERR conns=$CONNS"
        for role in front back; do
            python3 - "$DIR/$role.strace" "$N" "$role" <<'PY'
import sys
rows, n, role = [], float(sys.argv[2]), sys.argv[3]
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        rows.append((int(f[3]), f[-1]))
    if f and f[-1] == "total":
        total = int(f[3]) if len(f) >= 5 else 0
rows.sort(reverse=True)
print(f"{role} syscalls/req={total/n:.3f}  " + "  ".join(f"{name}={c/n:.3f}" for c, name in rows[:8]))
PY
        done
        ;;
    record|nginx-record|floor-record)
        perf record -q -e cpu-clock -F 2000 -g -p "$FRONT_PID" -o "$OUT/front.perf.data" 2>/dev/null &
        RF=$!
        perf record -q -e cpu-clock -F 2000 -g -p "$BACK_PID" -o "$OUT/back.perf.data" 2>/dev/null &
        RB=$!
        sleep 0.5
        read -r N DUR ERR P50 P99 P999 < <(load "$SECS")
        kill -INT $RF $RB; wait $RF $RB 2>/dev/null
        echo "requests=$N errors=$ERR conns=$CONNS; perf report -i $OUT/{front,back}.perf.data"
        ;;
    order)
        load "$SECS" >/dev/null
        for admin in "$FRONT_ADMIN" "$BACK_ADMIN"; do
            for page in /status /metrics /live /ready /; do
                curl -s -o /dev/null "http://127.0.0.1:$admin$page"
            done
        done
        callgrind_control -d "$BACK_PID" >/dev/null 2>&1; callgrind_control -d "$FRONT_PID" >/dev/null 2>&1
        sleep 1
        nm --defined-only "$BIN" >"$OUT/symbols.txt"
        echo "profiled $BIN into $OUT; then: python3 benches/perf/hot_text.py benches/perf/hot_text.ld $OUT [another profile's OUT]"
        ;;
    wall)
        read -r N DUR ERR P50 P99 P999 < <(load "$SECS")
        rps=$(python3 -c "print(round($N/($DUR/1e6)))")
        echo "requests=$N rps=$rps errors=$ERR p50=${P50}us p99=${P99}us p999=${P999}us conns=$CONNS peer_protocol=${PEER_PROTOCOL:-http1} front_to_back_connections=$(ss -Htn state established "( dport = :$BACK )" | wc -l)"
        ;;
esac
if [ "$OVER" = 1 ]; then
    echo "FAIL: instructions a request past the guard (caller $GUARD_CALLER, callee $GUARD_CALLEE; docs/performance.md)" >&2
    exit 3
fi
