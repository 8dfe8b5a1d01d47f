#!/bin/bash
# usage: run.sh RATE TAG EPOCHS REPS
set -u
cd /work/wt-24
export PYTHONPATH=/work/wt-24/src
PY=/work/main/.venv/bin/python
RATE=$1; TAG=$2; EPOCHS=$3; REPS=$4
OUT=/tmp/h24
export COLLECTIVES_TUNING_FILE=$OUT/tune_$TAG.json
$PY bench/cluster.py up --name h24 --hosts 2 --ranks-per-host 2 --rate $RATE --subnet 10.199.124.0/24
echo "== tune $(date -u +%T) $(uptime)"
$PY bench/cluster.py run --name h24 -- $PY -m collectives.tuning.tune --sizes 1M,16M --codec topk:ratio=0.01 -o $COLLECTIVES_TUNING_FILE > $OUT/tune_$TAG.log 2>&1
tail -4 $OUT/tune_$TAG.log
for rep in $(seq 1 $REPS); do
  for cfg in dense auto topk; do
    case $cfg in dense) C="";; auto) C="--codec auto:topk:ratio=0.01";; topk) C="--codec topk:ratio=0.01";; esac
    echo "== $cfg rep $rep $(date -u +%T) $(uptime)"
    $PY bench/cluster.py run --name h24 -- $PY -m collectives.sgd --model wide --subset 1024 --quiet \
      --epochs $EPOCHS --algorithm hierarchical $C --log $OUT/sgd_${cfg}_${TAG}_$rep.json > $OUT/sgd_${cfg}_${TAG}_$rep.txt 2>&1
    grep -E "final|step \(|communication|encode/decode|^grads" $OUT/sgd_${cfg}_${TAG}_$rep.txt
  done
done
$PY bench/cluster.py down --name h24
echo "== done $(date -u +%T) $(uptime)"
