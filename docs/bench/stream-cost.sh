#!/usr/bin/env bash
# The measurements of issue 26 (the cost of a stream), into
# docs/bench/stream-cost-*. Run from anywhere:
#
#   bash docs/bench/stream-cost.sh [<git-ref>]      # default ref: b031bde,
#                                                  # main before issue 26
#   PARTS="latency scale" bash docs/bench/stream-cost.sh
#
# Parts:
#   hot      the in-process fan-out (BenchmarkFanout, AppendReady and Events
#            consumers) and one client through the Handler (BenchmarkHandler),
#            this tree against <git-ref>, in ROUNDS interleaved rounds, with
#            benchstat.
#   latency  BenchmarkDeliveryLatency (64 subscribers, 10,000 events/s, a
#            sleeping and a yielding publisher, every event's latency), this
#            tree against <git-ref> built with this tree's benchmark file, in
#            ROUNDS interleaved rounds.
#   http     the peer harness's paced HTTP scenario at 64 clients and 10,000
#            events/s with the same two publishers: eventbus's Handler against
#            the naive handler, latency distribution and losses.
#   scale    the scale program (benchmarks/scale): 10,000 idle connections,
#            eventbus against the naive handler, SCALE_RUNS runs.
#   floors   the scale program with its two floors (-impl floors: eventbus,
#            floor, floor-raw, naive), SCALE_RUNS runs with the heartbeat
#            and as many with -heartbeat 1h (the fan-out alone).
# ROUNDS (default 8) and SCALE_RUNS (default 3) set the repetitions. Every
# file records the load average before and after; on a busy machine the
# numbers move by 2x and more: compare runs made at the same load.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/bench
base=${1:-b031bde}
parts=${PARTS:-hot latency http scale floors}
rounds=${ROUNDS:-8}
bench() { go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$@"; }
load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"; }
want() { [[ " $parts " == *" $1 "* ]]; }
# scale FILE ARGS...: the scale program at 10,000 connections, SCALE_RUNS
# runs, with ARGS added, into $out/FILE between two load averages.
scale() {
  local file=$1
  shift
  {
    load
    (cd benchmarks && go run ./scale -conns 10000 -sessions 200 -runs "${SCALE_RUNS:-3}" "$@")
    load
  } > "$out/$file"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" | tar -x -C "$tmp"
# The base tree gets this tree's paced benchmark and its helpers, so both
# sides run the same measurement (the library under it is the base's).
cp bench_paced_test.go "$tmp/"
cp internal/benchkit/*.go "$tmp/internal/benchkit/"
go test -c -o "$tmp/new.test" .
(cd "$tmp" && go test -c -o "$tmp/base.test" .)

if want hot; then
  {
    load
    for i in $(seq 1 "$rounds"); do
      for side in base new; do
        "$tmp/$side.test" -test.run '^$' -test.bench '^BenchmarkFanout$/subs=/^impl=eventbus(-events)?$' -test.benchmem -test.benchtime 200000x |
          sed "s/impl=eventbus/impl=$side/"
        "$tmp/$side.test" -test.run '^$' -test.bench '^BenchmarkHandler$' -test.benchmem -test.benchtime 20000x |
          sed "s/^BenchmarkHandler/BenchmarkHandler-$side/"
      done
    done
    load
  } > $out/stream-cost-hot.txt
  {
    bench -col /impl -filter '.unit:sec/delivery /impl:(base OR new)' $out/stream-cost-hot.txt || true
    bench -col /impl -filter '.unit:sec/delivery /impl:(base-events OR new-events)' $out/stream-cost-hot.txt || true
    sed -n '/BenchmarkHandler-base/s/BenchmarkHandler-base/BenchmarkHandler/p' $out/stream-cost-hot.txt > "$tmp/h-base.txt"
    sed -n '/BenchmarkHandler-new/s/BenchmarkHandler-new/BenchmarkHandler/p' $out/stream-cost-hot.txt > "$tmp/h-new.txt"
    bench base="$tmp/h-base.txt" new="$tmp/h-new.txt" || true
  } > $out/stream-cost-hot-benchstat.txt
fi

if want latency; then
  {
    load
    for i in $(seq 1 "$rounds"); do
      for side in base new; do
        "$tmp/$side.test" -test.run '^$' -test.bench '^BenchmarkDeliveryLatency$' -test.benchtime 1x |
          sed "s/^BenchmarkDeliveryLatency/BenchmarkDeliveryLatency-$side/"
      done
    done
    load
  } > $out/stream-cost-latency.txt
fi

if want http; then
  {
    load
    (cd benchmarks && go run . -scenarios paced-http -paced-http-clients 64 -paced-rates 10000 \
      -paced-modes sleep,yield -paced-count "$rounds" -paced-duration 2s -libs 'eventbus,naive')
    load
  } > $out/stream-cost-http.md
fi

if want scale; then
  scale stream-cost-scale.md
fi

if want floors; then
  scale stream-cost-scale-floors.txt -impl floors
  scale stream-cost-scale-floors-nohb.txt -impl floors -heartbeat 1h -idle 2s
fi
