#!/usr/bin/env bash
# The three backplanes side by side, in one run: BenchmarkPublishToDelivery
# of redisbus, pgbus and natsbus (replicas 1 and 3, publishers 1 and 16;
# backplane/backplanetest.Delivery's metrics), ROUNDS interleaved rounds
# (redis, pg, nats, redis, pg, nats, ...), so that the machine's load
# falls on every engine alike. Redis: the benchmark's own redis-server,
# no persistence. PostgreSQL: .ci/pg.sh's throwaway server (fsync off).
# NATS: an embedded nats-server with file storage (JetStream's default
# sync). Output: docs/bench/engines-<engine>.txt, one line per benchmark
# and round; compare with benchstat.
#
#   bash docs/bench/engines.sh            # 3 rounds of 2 s each
#   ROUNDS=5 BENCHTIME=3s bash docs/bench/engines.sh
#
# Every engine must run: redis-server must be on PATH (bash .ci/redis.sh
# installs Debian's), and CI=true makes the benchmarks fail, not skip, when
# a server is missing; a round that fails or reports nothing stops the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
BENCHTIME=${BENCHTIME:-2s}
OUT=docs/bench
export CI=true
if ! command -v redis-server >/dev/null 2>&1; then
  echo "engines: redis-server is not on PATH, and the Redis rounds need it:" >&2
  echo "engines: install it (apt-get install -y redis-server, or bash .ci/redis.sh, which installs it and runs redisbus's tests), then run again" >&2
  exit 1
fi
if [ -z "${PGBUS_TEST_URL:-}" ]; then
  exec bash .ci/pg.sh exec env ROUNDS="$ROUNDS" BENCHTIME="$BENCHTIME" bash "$0"
fi
for e in redis pg nats; do
  (cd "${e}bus" && go test -c -o "/tmp/engines-$e.test" .)
  : >"$OUT/engines-$e.txt"
done
uptime | tee "$OUT/engines-load.txt"
for r in $(seq 1 "$ROUNDS"); do
  for e in redis pg nats; do
    echo "round $r: $e" >&2
    if ! res=$(cd "${e}bus" && "/tmp/engines-$e.test" -test.run '^$' -test.bench '^BenchmarkPublishToDelivery$' \
      -test.benchtime "$BENCHTIME" -test.count 1 2>&1); then
      echo "$res" >&2
      echo "engines: round $r: the $e benchmark failed" >&2
      exit 1
    fi
    if ! grep -q '^BenchmarkPublishToDelivery' <<<"$res"; then
      echo "$res" >&2
      echo "engines: round $r: the $e benchmark reported nothing (skipped?)" >&2
      exit 1
    fi
    grep -E '^(Benchmark|goos|goarch|cpu|pkg)' <<<"$res" >>"$OUT/engines-$e.txt"
  done
  uptime | tee -a "$OUT/engines-load.txt"
done
