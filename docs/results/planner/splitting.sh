#!/bin/sh
# Where splitting pays (docs/planner.md): on 4 hosts x 1 rank at 1 Gbit/s with the deep model, the
# planner's first choice of its quiet 4 x 1 sweep (stop65_4x1_1gbit.json: dp 1 pp 2 tp 2, 2
# micro-batches, 1F1B) against dense data parallelism over the 4 hosts, the same global batch of
# 128, launches alternating ($PREFIX_choice_*.json, $PREFIX_dp_*.json, .log, .load). As root, from
# the repository root, the environment's python first on PATH.
#   stop 66: the driver's default recipe, 10 epochs (PREFIX=split, RECIPE="--epochs 10")
#   stop 67: a recipe whose curves do not hang on the order of the sums (the default below)
#   stop 68: the first choice of the stop-68 sweeps, tp 4 (PREFIX=tp4, CHOICE="--mesh dp=1,pp=1,tp=4")
set -e
R=docs/results/planner
P=${PREFIX:-recipe}
RECIPE=${RECIPE:---lr 0.005 --warmup-epochs 2 --epochs 20}
CHOICE=${CHOICE:---mesh dp=1,pp=2,tp=2 --micro-batches 2 --schedule 1f1b}
python bench/cluster.py up --name hsplit --hosts 4 --ranks-per-host 1 --rate 1gbit --subnet 10.199.161.0/24
for i in ${LAUNCHES:-1 2}; do
    uptime > $R/${P}_choice_$i.load
    python bench/cluster.py run --name hsplit -- python -m collectives.sgd --model deep --batch-size 128 \
        $CHOICE $RECIPE --quiet \
        --log $R/${P}_choice_$i.json > $R/${P}_choice_$i.log 2>&1
    uptime >> $R/${P}_choice_$i.load
    uptime > $R/${P}_dp_$i.load
    python bench/cluster.py run --name hsplit -- python -m collectives.sgd --model deep --batch-size 32 \
        $RECIPE --quiet --log $R/${P}_dp_$i.json > $R/${P}_dp_$i.log 2>&1
    uptime >> $R/${P}_dp_$i.load
done
python bench/cluster.py down --name hsplit
