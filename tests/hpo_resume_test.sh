#!/bin/sh
# frugal-hpo killed mid-search keeps every finished trial, and a restart
# continues the same log to the trial count; a trial that crashes or runs
# past --timeout is recorded as failed and the search goes on.
#   hpo_resume_test.sh FRUGAL_HPO WORK_DIR
set -eu
hpo=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
printf '%s' '{"x": {"uniform": [0, 1]}, "n": {"integer": [1, 4]}}' > space.json
cmd='sleep 0.3; if [ {trial} = 1 ]; then exit 3; fi; if [ {trial} = 13 ]; then sleep 30; fi; echo "{\"loss\": {x}, \"n\": {n}}"'
timeout -s KILL 1.6 "$hpo" --space space.json --command "$cmd" --metric loss --trials 16 --workers 2 --timeout 1.5 --log log.jsonl || true
first=$(wc -l < log.jsonl)
if [ "$first" -lt 2 ] || [ "$first" -ge 16 ]; then echo "FAIL: the killed search left $first trials, expected some"; exit 1; fi
cp log.jsonl before.jsonl
"$hpo" --space space.json --command "$cmd" --metric loss --trials 16 --workers 2 --timeout 1.5 --log log.jsonl --json > result.json
lines=$(wc -l < log.jsonl)
[ "$lines" = 16 ] || { echo "FAIL: $lines trials in the log, expected 16"; exit 1; }
head -n "$first" log.jsonl | cmp - before.jsonl || { echo "FAIL: the resumed search changed the killed one's trials"; exit 1; }
grep -q '"trial":1,"status":"failed"' log.jsonl || { echo "FAIL: trial 1 exited 3 and is not recorded as failed"; exit 1; }
grep -q '"trial":13,"status":"timeout"' log.jsonl || { echo "FAIL: trial 13 ran past the timeout and is not recorded so"; exit 1; }
grep -q '"best_value"' result.json || { echo "FAIL: no result line"; exit 1; }
echo "ok: $first trials before the kill, 16 after the restart"
