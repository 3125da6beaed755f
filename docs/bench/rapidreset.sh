#!/usr/bin/env bash
# Issue 22's HTTP/2 rapid reset against the demo daemon, measured from
# outside (BENCHMARKS.md, "Memory under attack"; docs/bench/NOTES.md,
# "HTTP/2 rapid reset against the demo daemon").
#
#   bash docs/bench/rapidreset.sh [PREFIX_REF]
#
# Builds cmd/sessiond from the working tree, and from PREFIX_REF (default
# 84e8886^, the commit before the fix; built in a throwaway git worktree)
# another one, then runs benchmarks/rapidreset in its orchestration mode
# for each case, one after the other: the daemon on a free port (it serves
# h2c without TLS), GODEBUG=gctrace=1, session "h" created by a POST, the
# burst, its RSS sampled every 250 ms during it and for AFTER after it, a
# collection forced at the end, then SIGTERM. Cases (CASES, space-separated):
#
#   fixed           the working tree's daemon, default flags (-write-timeout 30s)
#   fixed-wt3s      the same with -write-timeout 3s
#   fixed-unknown   the same, the streams on a session that does not exist
#   prefix          PREFIX_REF's daemon, default flags
#   prefix-wt3s, prefix-unknown   as the fixed ones, on PREFIX_REF's daemon
#
# Environment: CASES (default "fixed fixed-wt3s fixed-unknown prefix"),
# CONNS (8), RATE (31000), DURATION (20s), AFTER (40s), PAUSE between cases
# in seconds (5), OUT (default: a new directory under /tmp). Each case
# writes OUT/CASE.txt (the report), OUT/CASE.csv (the RSS samples) and
# OUT/CASE.log (the daemon's stderr: its log and the gctrace lines). Linux
# only (it reads /proc).
set -euo pipefail
cd "$(dirname "$0")/../.."

prefix_ref=${1:-84e8886^}
cases=${CASES:-fixed fixed-wt3s fixed-unknown prefix}
conns=${CONNS:-8} rate=${RATE:-31000} duration=${DURATION:-20s} after=${AFTER:-40s} pause=${PAUSE:-5}
out=${OUT:-$(mktemp -d /tmp/rapidreset.XXXXXX)}
mkdir -p "$out"
echo "== output in $out"

echo "== building: sessiond at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo ' (with uncommitted changes)'), the tool"
(cd cmd/sessiond && go build -o "$out/sessiond" .)
(cd benchmarks && go build -o "$out/rapidreset" ./rapidreset)
case " $cases " in
*" prefix"*)
  prefix_sha=$(git rev-parse --short "$prefix_ref")
  echo "== building: sessiond at $prefix_sha ($prefix_ref), in a throwaway worktree"
  git worktree add --detach "$out/prefix-src" "$prefix_ref" >/dev/null
  trap 'git worktree remove --force "$out/prefix-src" 2>/dev/null || true' EXIT
  (cd "$out/prefix-src/cmd/sessiond" && go build -o "$out/sessiond-prefix" .)
  git worktree remove --force "$out/prefix-src"
  ;;
esac

echo "== $(go version); $(nproc) CPUs; $(uname -srm)"
echo "== uptime before: $(uptime)"
first=1
for c in $cases; do
  bin=$out/sessiond args=() label=$c
  case $c in
  prefix*) bin=$out/sessiond-prefix label="$c ($prefix_sha)" ;;
  esac
  case $c in
  fixed | prefix) ;;
  *-wt3s) args=(-daemon-args "-write-timeout 3s") ;;
  *-unknown) args=(-create "" -path /session/nope/events) ;;
  *) echo "unknown case $c" >&2; exit 2 ;;
  esac
  [ "$first" = 1 ] || sleep "$pause"
  first=0
  echo "== $label"
  "$out/rapidreset" -daemon "$bin" "${args[@]}" -conns "$conns" -rate "$rate" -duration "$duration" \
    -after "$after" -label "$label" -samples "$out/$c.csv" -daemon-log "$out/$c.log" | tee "$out/$c.txt"
done
echo "== uptime after: $(uptime)"

echo
echo "== summary ($conns connections, $rate streams/s for $duration, watched $after after)"
grep -m1 '^| case ' "$out/$(echo "$cases" | awk '{print $1}').txt"
grep -m1 '^|---' "$out/$(echo "$cases" | awk '{print $1}').txt"
for c in $cases; do grep '^| ' "$out/$c.txt" | grep -v '^| case ' | tail -1; done
