#!/usr/bin/env bash
# The measurements of issue 13 (catch-up, the iterator's accounting, the
# paced publishers), into docs/bench/catchup-*.txt. Run from anywhere:
#
#   bash docs/bench/catchup.sh            # this tree only
#   bash docs/bench/catchup.sh <git-ref>  # also interleaved A/B runs against
#                                         # <git-ref> (e.g. main) for the fan-out
#
# It takes about 25 minutes on a 2-core VM (the A/B part about 10 more).
# Each file starts with the load average; a busy machine moves the numbers
# by 2x and more, so compare runs made at the same load, or rerun.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/bench
base=${1:-}
bench() { go run golang.org/x/perf/cmd/benchstat@latest "$@"; }
load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"; }

go test -c -o /tmp/catchup-new.test .

# The fan-out per delivery (AppendReady and Events consumers) against the
# naive channel bus, and optionally against <git-ref>, interleaved.
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

# Publish latency, 64 healthy vs one stalled or blocked, under evict and catchup.
{ load; /tmp/catchup-new.test -test.run '^$' -test.bench 'PublishLatency' -test.benchtime 200000x -test.count 10; load; } > $out/catchup-latency.txt
bench $out/catchup-latency.txt > $out/catchup-latency-benchstat.txt || true

# Paced publishers at 100,000/s (1000 subscribers: 5,000/s), every impl.
{ load; /tmp/catchup-new.test -test.run '^$' -test.bench '^BenchmarkPaced$' -test.benchtime 1x -test.count 3; load; } > $out/catchup-paced.txt

# The peer harness: the highest rate each library sustains losslessly.
(cd benchmarks && go run . -scenarios stall,paced,paced-http -paced-count 2) > $out/catchup-peers.md
echo "wrote $out/catchup-*.txt and $out/catchup-peers.md"
