#!/bin/bash
# usage: run2.sh RATE TAG EPOCHS FIRST LAST  (dense and auto only, reusing tune_TAG.json)
set -u
cd /work/wt-24
export PYTHONPATH=/work/wt-24/src
PY=/work/main/.venv/bin/python
RATE=$1; TAG=$2; EPOCHS=$3; FIRST=$4; LAST=$5
OUT=/tmp/h24
export COLLECTIVES_TUNING_FILE=$OUT/tune_$TAG.json
$PY bench/cluster.py up --name h24 --hosts 2 --ranks-per-host 2 --rate $RATE --subnet 10.199.124.0/24
for rep in $(seq $FIRST $LAST); do
  for cfg in dense auto; do
    case $cfg in dense) C="";; auto) C="--codec auto:topk:ratio=0.01";; esac
    echo "== $cfg rep $rep $(date -u +%T) $(uptime)"
    $PY bench/cluster.py run --name h24 -- $PY -m collectives.sgd --model wide --subset 1024 --quiet \
      --epochs $EPOCHS --algorithm hierarchical $C --log $OUT/sgd_${cfg}_${TAG}_$rep.json > $OUT/sgd_${cfg}_${TAG}_$rep.txt 2>&1
    grep -E "final|step \(|^grads" $OUT/sgd_${cfg}_${TAG}_$rep.txt
  done
done
$PY bench/cluster.py down --name h24
echo "== done $(date -u +%T) $(uptime)"
