#!/bin/bash
set -u
cd /work/wt-24
export PYTHONPATH=/work/wt-24/src
PY=/work/main/.venv/bin/python
OUT=/tmp/h24
export COLLECTIVES_TUNING_FILE=$OUT/tune_10g_quiet.json
echo "== retune $(date -u +%T) $(uptime)"
$PY bench/cluster.py up --name h24 --hosts 2 --ranks-per-host 2 --rate 10gbit --subnet 10.199.124.0/24
$PY bench/cluster.py run --name h24 -- $PY -m collectives.tuning.tune --sizes 1M,16M --codec topk:ratio=0.01 -o $COLLECTIVES_TUNING_FILE
echo "== ab3 $(date -u +%T) $(uptime)"
$PY bench/cluster.py run --name h24 -- \
  $PY bench/compressed_allreduce.py --bytes 68354088 --iterations 11 --dense hierarchical \
  --codec auto:topk:ratio=0.01 --codec topk:ratio=0.01 --algorithm hierarchical --json $OUT/ab3_10g_quiet.json
$PY bench/cluster.py down --name h24
echo "== done $(date -u +%T) $(uptime)"
