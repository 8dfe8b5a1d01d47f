#!/bin/bash
# usage: ab.sh RATE TAG ITER
set -u
cd /work/wt-24
export PYTHONPATH=/work/wt-24/src
PY=/work/main/.venv/bin/python
RATE=$1; TAG=$2; IT=$3
OUT=/tmp/h24
export COLLECTIVES_TUNING_FILE=$OUT/tune_$TAG.json
echo "== ab $TAG $(date -u +%T) $(uptime)"
$PY bench/cluster.py run --name h24ab --hosts 2 --ranks-per-host 2 --rate $RATE --subnet 10.199.124.0/24 -- \
  $PY bench/compressed_allreduce.py --bytes 68354088 --iterations $IT --dense hierarchical \
  --codec auto:topk:ratio=0.01 --codec topk:ratio=0.01 --algorithm hierarchical --json $OUT/ab_$TAG.json
echo "== done $(date -u +%T) $(uptime)"
