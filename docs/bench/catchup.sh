#!/usr/bin/env bash
# The measurements of issue 13 (catch-up, the iterator's accounting, the
# paced publishers), into docs/bench/catchup-*. Run from anywhere:
#
#   bash docs/bench/catchup.sh            # this tree only
#   bash docs/bench/catchup.sh <git-ref>  # the fan-out also as interleaved
#                                         # A/B runs against <git-ref> (e.g. main)
#   PARTS="latency paced" bash docs/bench/catchup.sh   # some parts only
#
# Parts: fanout (per delivery, AppendReady and Events consumers, against the
# naive channel bus or <git-ref>), latency (Publish p50/p99 beside a stalled
# or blocked subscriber, under evict and catchup, and Publish beside 1000
# subscribers catching up), paced (BenchmarkPaced: losses, achieved rate,
# delivery latency), peers (the peer harness: stall, and the highest rate
# each library sustains losslessly, in process and over HTTP). All of it
# takes about 30 minutes on a 2-core VM. Each file records the load average
# before and after; a busy machine moves the numbers by 2x and more, so
# compare runs made at the same load, or rerun.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/bench
base=${1:-}
parts=${PARTS:-fanout latency paced peers}
bench() { go run golang.org/x/perf/cmd/benchstat@latest "$@"; }
load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"; }
want() { [[ " $parts " == *" $1 "* ]]; }

go test -c -o /tmp/catchup-new.test .

if want fanout; then
  {
    load
    if [ -n "$base" ]; then
      tmp=$(mktemp -d)
      git archive "$base" | tar -x -C "$tmp"
      (cd "$tmp" && go test -c -o /tmp/catchup-base.test .)
      for i in $(seq 1 10); do
        /tmp/catchup-base.test -test.run '^$' -test.bench '^BenchmarkFanout$/subs=/^impl=eventbus$' -test.benchtime 200000x |
          sed 's/impl=eventbus/impl=base/'
        /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkFanout$/subs=/^impl=eventbus(-events)?$' -test.benchtime 200000x
      done
      rm -rf "$tmp"
    else
      /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkFanout$' -test.benchmem -test.benchtime 200000x -test.count 10
    fi
    load
  } > $out/catchup-fanout.txt
  bench -col /impl -filter '.unit:sec/delivery' $out/catchup-fanout.txt > $out/catchup-fanout-benchstat.txt || true
fi

if want latency; then
  {
    load
    /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkPublishLatency$' -test.benchtime 200000x -test.count 10
    /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkCatchUpPublishLatency$' -test.benchtime 1x -test.count 5
    load
  } > $out/catchup-latency.txt
  bench $out/catchup-latency.txt > $out/catchup-latency-benchstat.txt || true
fi

if want paced; then
  # At 100,000/s (1000 subscribers: 5,000/s), every impl, both paces.
  { load; /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkPaced$' -test.benchtime 1x -test.count 3; load; } > $out/catchup-paced.txt
fi

if want peers; then
  (cd benchmarks && go run . -scenarios stall,paced,paced-http -paced-count 2) > $out/catchup-peers.md
fi
echo "wrote $out/catchup-*"
