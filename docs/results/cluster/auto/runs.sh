#!/bin/bash
# The runs behind docs/cluster.md, "codec='auto'" (as root, from anywhere; Python from $PY, default
# the checkout's .venv; outputs in $OUT, default this folder):
#   runs.sh tune RATE TAG                         collectives-tune with the codec -> tune_TAG.json
#   runs.sh sgd RATE TAG EPOCHS FIRST LAST CFG..  interleaved SGD runs, CFG in dense auto topk
#   runs.sh ab RATE TAG ITER NAME                 the exchange alone, call by call -> NAME_TAG.json
# RATE: 1gbit or 10gbit. Each step prints uptime first (the machine was shared).
set -eu
cd "$(dirname "$0")/../../../.."
PY=${PY:-$PWD/.venv/bin/python}
OUT=${OUT:-docs/results/cluster/auto}
what=$1; RATE=$2; TAG=$3
export COLLECTIVES_TUNING_FILE=$OUT/tune_$TAG.json
cluster() { $PY bench/cluster.py "$@"; }
up() { cluster up --name h24 --hosts 2 --ranks-per-host 2 --rate "$RATE" --subnet 10.199.124.0/24; }
echo "== $what $TAG $(date -u +%T) $(uptime)"
case $what in
tune)
  up
  cluster run --name h24 -- $PY -m collectives.tools.tuning.tune --sizes 1M,16M \
    --codec topk:ratio=0.01 -o "$COLLECTIVES_TUNING_FILE" > "$OUT/tune_$TAG.log" 2>&1
  tail -4 "$OUT/tune_$TAG.log"
  cluster down --name h24;;
sgd)
  EPOCHS=$4; FIRST=$5; LAST=$6; shift 6
  up
  for rep in $(seq "$FIRST" "$LAST"); do
    for cfg in "$@"; do
      case $cfg in dense) C="";; auto) C="--codec auto:topk:ratio=0.01";;
                   topk) C="--codec topk:ratio=0.01";; esac
      echo "== $cfg rep $rep $(date -u +%T) $(uptime)"
      cluster run --name h24 -- $PY -m collectives.sgd --model wide --subset 1024 --quiet \
        --epochs "$EPOCHS" --algorithm hierarchical $C --log "$OUT/sgd_${cfg}_${TAG}_$rep.json" \
        > "$OUT/sgd_${cfg}_${TAG}_$rep.txt" 2>&1
      grep -E "final|step \(|communication|encode/decode|^grads" "$OUT/sgd_${cfg}_${TAG}_$rep.txt"
    done
  done
  cluster down --name h24;;
ab)
  ITER=$4; NAME=$5
  cluster run --name h24ab --hosts 2 --ranks-per-host 2 --rate "$RATE" \
    --subnet 10.199.124.0/24 -- $PY bench/compressed_allreduce.py --bytes 68354088 \
    --iterations "$ITER" --dense hierarchical --codec auto:topk:ratio=0.01 \
    --codec topk:ratio=0.01 --algorithm hierarchical --json "$OUT/${NAME}_$TAG.json";;
*) echo "usage: runs.sh tune|sgd|ab ... (see the header)" >&2; exit 2;;
esac
echo "== done $(date -u +%T) $(uptime)"
