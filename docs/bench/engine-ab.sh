#!/usr/bin/env bash
# Issue 34 point 6: the hot paths before the one stream engine against after
# it, into docs/bench/engine-ab.txt. Run from anywhere:
#
#   bash docs/bench/engine-ab.sh [<base-ref>]     # default: 91886b9, main
#                                                 # before the engine
#   ROUNDS=10 BENCHTIME=1s MID=<ref> bash docs/bench/engine-ab.sh
#
# It builds one test binary per side, once: old from <base-ref> with this
# tree's engine_bench_test.go copied in (BenchmarkStreamEngine uses the
# exported API only, so it runs unchanged on both), new from this working
# tree, and, when MID is set, mid from <MID> the same way as old (to measure
# a change to the engine apart from the engine itself). Then ROUNDS rounds,
# each running every binary once on the same benchmarks (BenchmarkFanout,
# BenchmarkHandler, BenchmarkMux, BenchmarkStreamEngine, -count 1), the
# order of the binaries rotating from round to round, with the load average
# between rounds, and benchstat on the per-side files. Raw output goes to
# $OUT (default: a temporary directory, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:-91886b9}
mid=${MID:-}
rounds=${ROUNDS:-10}
benchtime=${BENCHTIME:-1s}
regex=${BENCH:-'^Benchmark(Fanout|Handler|Mux|StreamEngine)$'}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
bench() {
  if [[ -x ~/go/bin/benchstat ]]; then ~/go/bin/benchstat "$@"
  else go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$@"; fi
}
load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"; }

# build SIDE REF: a test binary of REF with this tree's engine benchmark.
build() {
  local dir="$out/src-$1"
  rm -rf "$dir" && mkdir -p "$dir"
  git archive "$2" | tar -x -C "$dir"
  cp engine_bench_test.go "$dir/"
  (cd "$dir" && go test -c -o "$out/$1.test" .)
}
sides="old new"
build old "$base"
if [[ -n $mid ]]; then
  build mid "$mid"
  sides="old mid new"
fi
go test -c -o "$out/new.test" .
echo "# old $(git rev-parse --short "$base"), new $(git rev-parse --short HEAD) + working tree${mid:+, mid $(git rev-parse --short "$mid")}" > "$out/raw.txt"
read -r -a order <<< "$sides"
for ((i = 1; i <= rounds; i++)); do
  load >> "$out/raw.txt"
  n=${#order[@]}
  for ((j = 0; j < n; j++)); do
    s=${order[(i + j) % n]}
    echo "# round $i $s" >> "$out/raw.txt"
    "$out/$s.test" -test.run '^$' -test.bench "$regex" -test.benchmem -test.count 1 \
      -test.benchtime "$benchtime" 2>&1 | tee -a "$out/$s.txt" >> "$out/raw.txt"
  done
done
load >> "$out/raw.txt"
pairs="old:new"
[[ -z $mid ]] || pairs="old:new old:mid mid:new"
for p in $pairs; do
  echo "== benchstat ${p%:*}.txt ${p#*:}.txt" >> "$out/benchstat.txt"
  (cd "$out" && bench "${p%:*}.txt" "${p#*:}.txt") >> "$out/benchstat.txt"
done
echo "$out"
