#!/usr/bin/env bash
# The demo daemon's RSS against its memory budget (docs/hub.md, "Sizing
# memory"; issue 22): cmd/sessiond is built and started with each set of
# flags below, then SESSIONS sessions are filled at once (one curl loop
# each) with EVENTS POSTs of an event of EVENT_BYTES bytes of data, so that
# the rings take TIMES times -max-total-bytes and the budget evicts the
# oldest events the whole time. The peak (VmHWM) and the RSS at the end
# (VmRSS) come from /proc/PID/status; the daemon's logged memory limit,
# and the POSTs that were not answered 200 (503 server_busy past the body
# budget, or anything else) are printed beside them. Each set of flags
# runs with the limit the daemon sets from its budget, then with
# GOMEMLIMIT=off (no limit), for contrast; ROUNDS rounds of each. The
# sets (SETS): "small" -max-total-bytes 64 MiB -max-event-bytes 1 MiB
# -max-subscribers 8, "small-alone" -max-total-bytes 64 MiB, "large" the
# same as small with 256 MiB, "defaults" no flag (256 MiB of rings).
# docs/bench/rss-budget.txt is its output.
#
#   bash docs/bench/rss-budget.sh              # 3 rounds, 4 times the rings
#   ROUNDS=1 TIMES=2 SETS=small bash docs/bench/rss-budget.sh
#
# Linux only (/proc). Needs go and curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
TIMES=${TIMES:-4}
SESSIONS=${SESSIONS:-8}
EVENT_BYTES=${EVENT_BYTES:-900000}
SETS=${SETS:-small small-alone large defaults}
MIB=$((1 << 20))

TMP=$(mktemp -d /tmp/rss-budget.XXXXXX)
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

(cd cmd/sessiond && go build -o "$TMP/sessiond" .)
printf '{"type":"note","data":"%s"}' "$(head -c "$EVENT_BYTES" /dev/zero | tr '\0' x)" >"$TMP/event.json"

# kib FIELD: a "Vm..." line of the daemon's /proc status, in KiB.
kib() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$PID/status"; }

# run LABEL RINGS_BYTES FLAGS...: one daemon, filled, measured, stopped.
run() {
  local label=$1 rings=$2
  shift 2
  : >"$TMP/log"
  "$TMP/sessiond" -addr 127.0.0.1:0 "$@" 2>"$TMP/log" &
  PID=$!
  local url=""
  for _ in $(seq 1 100); do
    url=$(sed -n 's/.*msg="sessiond listening" addr=[^ ]* url=\([^ ]*\)\/.*/\1/p' "$TMP/log" | head -1)
    [ -n "$url" ] && break
    sleep 0.1
  done
  if [ -z "$url" ]; then cat "$TMP/log" >&2; exit 1; fi
  local limit
  limit=$(grep -o 'msg="memory limit[^"]*" [^ ]* [^ ]*' "$TMP/log" | head -1)
  # Each session gets TIMES × rings / SESSIONS bytes of events.
  local per=$(((TIMES * rings / SESSIONS + EVENT_BYTES - 1) / EVENT_BYTES))
  local s loops=()
  for s in $(seq 1 "$SESSIONS"); do
    for _ in $(seq 1 "$per"); do
      curl -s -o /dev/null -w '%{http_code}\n' -X POST --data-binary @"$TMP/event.json" \
        -H 'Content-Type: application/json' "$url/session/s$s/events"
    done >"$TMP/codes.$s" &
    loops+=($!)
  done
  wait "${loops[@]}"
  local hwm rss other
  hwm=$(kib VmHWM)
  rss=$(kib VmRSS)
  other=$(cat "$TMP"/codes.* | grep -cv '^200$' || true)
  rm -f "$TMP"/codes.*
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=""
  awk -v l="$label" -v h="$hwm" -v r="$rss" -v n=$((per * SESSIONS)) -v o="$other" -v m="$limit" \
    'BEGIN { printf "%-72s peak %6.1f MiB  end %6.1f MiB  (%d POSTs, %d not 200; %s)\n", l, h / 1024, r / 1024, n, o, m }'
}

uname -sr
go version
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r"
  for env in budget off; do
    if [ "$env" = off ]; then export GOMEMLIMIT=off; else unset GOMEMLIMIT; fi
    for set in $SETS; do
      case $set in
      small) flags=(-max-total-bytes $((64 * MIB)) -max-event-bytes $MIB -max-subscribers 8) rings=$((64 * MIB)) ;;
      small-alone) flags=(-max-total-bytes $((64 * MIB))) rings=$((64 * MIB)) ;;
      large) flags=(-max-total-bytes $((256 * MIB)) -max-event-bytes $MIB -max-subscribers 8) rings=$((256 * MIB)) ;;
      defaults) flags=() rings=$((256 * MIB)) ;;
      *) echo "unknown set $set" >&2; exit 2 ;;
      esac
      run "${flags[*]:-(defaults)}, GOMEMLIMIT=$env" "$rings" "${flags[@]}"
    done
  done
done
