#!/bin/sh
# Sharded data parallelism on the emulated cluster (docs/sharded.md, "On the emulated cluster").
# As root, from the repository root, with the environment's python first on PATH.
set -e
R=docs/results/cluster/sharded
step() {  # $1 tag, $2 hosts, $3 ranks per host, $4 subnet
    nice -n 5 python bench/cluster.py up --name hz$1 --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet $4
    uptime > $R/step_$1.load
    nice -n 5 python bench/cluster.py run --name hz$1 -- python bench/sharded_step.py --rounds 2 \
        --only 0,1,2,3,4,5,6,7,8 --json $R/step_$1.json -- --model wide --subset 768 --epochs 1 --quiet > $R/step_$1.log 2>&1
    uptime >> $R/step_$1.load
    python bench/cluster.py down --name hz$1
}
case "$1" in
    step2x2) step 2x2 2 2 10.199.50.0/24 ;;
    step4x1) step 4x1 4 1 10.199.51.0/24 ;;
esac
# the same, for chosen configurations (bench/sharded_step.py --only) and a shorter run
steps() {  # $1 tag, $2 hosts, $3 ranks per host, $4 subnet, $5 --only, $6 --subset
    nice -n 5 python bench/cluster.py up --name hz$1 --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet $4
    uptime > $R/step_$1.load
    nice -n 5 python bench/cluster.py run --name hz$1 -- python bench/sharded_step.py --rounds 1 \
        --only $5 --json $R/step_$1.json -- --model wide --subset $6 --epochs 1 --quiet > $R/step_$1.log 2>&1
    uptime >> $R/step_$1.load
    python bench/cluster.py down --name hz$1
}
case "$1" in
    steps4x1) steps 4x1 4 1 10.199.51.0/24 0,1,2,3,5,6,9,10 384 ;;
    steps2x2c) steps 2x2c 2 2 10.199.50.0/24 0,1,2,3,9,10,11,12 384 ;;
    steps2x1) steps 2x1 2 1 10.199.53.0/24 0,1,2,3,5,6,9,10 384 ;;
    steps2x2q) steps 2x2q 2 2 10.199.55.0/24 0,1,2,3,9,11,5 384 ;;
    # dense stage 2 against top-k + bf16 parameters at stage 2 (and without bf16), back to back
    steps2x2b) steps 2x2b 2 2 10.199.56.0/24 2,13,9 384 ;;
    steps4x1b) steps 4x1b 4 1 10.199.57.0/24 2,13,9 384 ;;
    steps2x2r) steps 2x2r 2 2 10.199.56.0/24 13,9,2 384 ;;  # the same three, in reverse order
    steps2x2s) steps 2x2s 2 2 10.199.56.0/24 2,13,9 384 ;;  # the first order again, later
esac
# 625 steps (5 epochs) on one node, 4 ranks: the final accuracy, which does not depend on where
# the ranks run (the same arithmetic in the same order); dense --shard 2 ends with data
# parallelism's (ring) parameters bit for bit, so its accuracy is data parallelism's
acc() {  # $1 name, then driver arguments
    name=$1; shift
    nice -n 5 mpiexec -n 4 python -m collectives.sgd --dataset synthetic --model wide --quiet \
        --epochs 5 --algorithm ring --log $R/$name.json "$@" > $R/$name.log 2>&1
}
case "$1" in
    acc)
        shift
        for run in "$@"; do
            case "$run" in
                dp) acc acc_dense_dp ;;
                topk2) acc acc_topk1_ef_zero2 --shard 2 --codec topk:ratio=0.01 --error-feedback ;;
                topk3bf16) acc acc_topk1_ef_bf16_zero3 --shard 3 --codec topk:ratio=0.01 \
                    --error-feedback --param-codec bf16 ;;
                topk2bf16) acc acc_topk1_ef_bf16_zero2 --shard 2 --codec topk:ratio=0.01 \
                    --error-feedback --param-codec bf16 ;;
                # the same with the per-bucket update (the fourth pass; the default since the third)
                topk2bf16pb) acc acc_topk1_ef_bf16_zero2_pb --shard 2 --codec topk:ratio=0.01 \
                    --error-feedback --param-codec bf16 ;;
            esac
        done ;;
esac
# 625 steps (5 epochs, batch 32 per rank) of the wide model, 2 hosts x 2 ranks (runs one after another;
# TAG=keep_ names the files tta_keep_*: stop 67's runs, stage 3 keeping layers from forward)
tta() {  # $1 name, then driver arguments
    name=$1; shift
    nice -n 5 python bench/cluster.py up --name hzt --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.52.0/24
    uptime > $R/$name.load
    nice -n 5 python bench/cluster.py run --name hzt -- python -m collectives.sgd --dataset synthetic \
        --model wide --quiet --epochs 5 --algorithm ring --log $R/$name.json "$@" > $R/$name.log 2>&1
    uptime >> $R/$name.load
}
# the runs by name: $file, the end of the files' names, and $args, the driver's arguments ($file
# empty: not a run)
tta_run() {
    file=; args=
    case "$1" in
        dense2) file=dense_zero2 args="--shard 2" ;;
        dense3) file=dense_zero3 args="--shard 3" ;;
        topk2) file=topk1_ef_zero2 args="--shard 2 --codec topk:ratio=0.01 --error-feedback" ;;
        topk2bf16) file=topk1_ef_bf16_zero2 args="--shard 2 --codec topk:ratio=0.01 --error-feedback --param-codec bf16" ;;
        topk3bf16) file=topk1_ef_bf16_zero3 args="--shard 3 --codec topk:ratio=0.01 --error-feedback --param-codec bf16" ;;
        dp) file=dense_dp ;;
    esac
}
case "$1" in
    tta)
        shift
        for run in "$@"; do
            tta_run $run
            if [ -n "$file" ]; then tta tta_${TAG:-}$file $args; fi
        done
        python bench/cluster.py down --name hzt ;;
esac
# the same workload on 4 hosts x 1 rank (stop 66), a run stopped after the epoch that reaches the
# target (--stop-after keeps the 5-epoch schedule; 0: the whole run); the epoch lines (the
# cumulative wall time) are the log
tta4() {  # $1 name, $2 the step to stop after (0: none), then driver arguments
    name=$1; stop=$2; shift 2
    nice -n 5 python bench/cluster.py up --name hzt4 --hosts 4 --ranks-per-host 1 --rate 1gbit --subnet 10.199.53.0/24
    uptime > $R/$name.load
    if [ "$stop" = 0 ]; then stop="--log $R/$name.json"; else stop="--stop-after $stop"; fi
    nice -n 5 python bench/cluster.py run --name hzt4 -- python -m collectives.sgd --dataset synthetic \
        --model wide --epochs 5 --algorithm ring $stop "$@" 2>&1 | tr '\r' '\n' \
        | grep -v "step/s\|s/step" > $R/$name.log
    uptime >> $R/$name.load
}
case "$1" in
    tta4x1)
        shift
        for run in "$@"; do
            stop=${STOP:-375}
            if [ $run = dense3 ]; then stop=${STOP:-0}; fi
            tta_run $run
            if [ -n "$file" ]; then tta4 tta4x1_${TAG:-}$file $stop $args; fi
        done
        python bench/cluster.py down --name hzt4 ;;
esac
# PyTorch: ShardedOptimizer and fully_shard against ZeroRedundancyOptimizer + DDP and FSDP2 over gloo
case "$1" in
    torch2x2)
        nice -n 5 python bench/cluster.py up --name hzp --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.54.0/24
        uptime > $R/torch_2x2.load
        nice -n 5 python bench/cluster.py run --name hzp -- python bench/torch_sharded.py --hidden 2048 \
            --batch 64 --steps 5 --rounds 3 --json $R/torch_2x2.json > $R/torch_2x2.log 2>&1 || true
        uptime >> $R/torch_2x2.load
        python bench/cluster.py down --name hzp ;;
esac
# ShardedOptimizer stage 2 with top-k 1 % + EF in the reduce-scatter and bf16 parameters in the
# allgather (codec=, param_codec=) against dense and ZeroRedundancyOptimizer + DDP (gloo)
codecs() {  # $1 tag, $2 hosts, $3 ranks per host
    nice -n 5 python bench/cluster.py up --name hspc --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet 10.199.77.0/24
    nice -n 5 python bench/cluster.py run --name hspc -- python bench/torch_sharded.py --hidden 2048 --steps 5 \
        --rounds 3 --only "ZeroRedundancy,ShardedOptimizer stage 2" --json $R/torch_codecs_$1.json > $R/torch_codecs_$1.log 2>&1
    python bench/cluster.py down --name hspc
}
case "$1" in
    codecs2x1) for i in 1 2 3; do codecs 2x1_$i 2 1; done ;;  # the runs kept one cluster up
    codecs2x2) codecs 2x2 2 2 ;;
esac
# Issue 52's speed targets, second pass (2026-12-07, docs/sharded.md "Second pass"): the default
# buckets (contiguous, 1/16 shard, blocking) against balanced, pipelined 1/4-shard buckets and
# others; bench/sharded_step.py prints each run's parameter digest (the bits check's detail).
# Configuration numbers: bench/sharded_step.py's CONFIGS, 0-based.
zacc() {  # $1 tag, $2 hosts, $3 ranks per host, $4 subnet, $5 --only, $6 --rounds
    python bench/cluster.py up --name ${NAME:-hzacc}$1 --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet $4
    uptime > $R/step_$1.load
    python bench/cluster.py run --name ${NAME:-hzacc}$1 -- python bench/sharded_step.py --rounds $6 \
        --only $5 --json $R/step_$1.json -- --model wide --subset 384 --epochs 1 --quiet > $R/step_$1.log 2>&1
    uptime >> $R/step_$1.load
    python bench/cluster.py down --name ${NAME:-hzacc}$1
}
case "$1" in
    steps2x2z0) zacc 2x2z0 2 2 10.199.71.0/24 0,1,2,5 1 ;;
    steps2x2z1) zacc 2x2z1 2 2 10.199.71.0/24 0,2,11,14,5,12,15 1 ;;
    steps2x2z2) zacc 2x2z2 2 2 10.199.71.0/24 0,1,2,14,16,5,12,15 2 ;;
    steps2x2z3) zacc 2x2z3 2 2 10.199.71.0/24 0,2,17,14,5,18,15 1 ;;
    steps4x1z4) zacc 4x1z4 4 1 10.199.72.0/24 0,1,2,14,5,15 1 ;;
    # what shard-sized buckets (stage 1's count of calls) would give at stage 2, memory aside
    steps2x2z5) zacc 2x2z5 2 2 10.199.71.0/24 0,1,2,14,19,20 1 ;;
    # the exchange alone (no computation), every pattern of bench/sharded_exchange.py
    exchange2x2z)
        python bench/cluster.py up --name hzaccx --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.71.0/24
        python bench/cluster.py run --name hzaccx -- python bench/sharded_exchange.py --rounds 3 > $R/exchange_2x2z.log 2>&1
        python bench/cluster.py down --name hzaccx ;;
esac
# Third pass (2026-12-07): the per-bucket update (sharded.PER_BUCKET, the default now) and the
# bucket plans it allows within the memory bound, against data parallelism and the layouts
# before it; bench/sharded_step.py's CONFIGS 21-28 are the per-bucket ones.
zpb() {  # the same steps as zacc, clusters named hzbkt...
    NAME=hzbkt zacc "$@"
}
case "$1" in
    steps2x2p1) zpb 2x2p1 2 2 10.199.81.0/24 0,2,21,22,23,5,24,25 2 ;;
    steps4x1p2) zpb 4x1p2 4 1 10.199.82.0/24 0,2,21,22,23,5,24,25 2 ;;
    # data parallelism, stage 1 and the per-bucket plans, three rounds (the order rotating)
    steps2x2p3) zpb 2x2p3 2 2 10.199.81.0/24 0,21,1,22,24,25 3 ;;
    steps4x1p4) zpb 4x1p4 4 1 10.199.82.0/24 0,21,1,22,24,25 3 ;;
    # stage 2 blocking against pipelined, with data parallelism, four rounds
    steps2x2p5) zpb 2x2p5 2 2 10.199.81.0/24 0,21,22 4 ;;
    steps4x1p6) zpb 4x1p6 4 1 10.199.82.0/24 0,21,22 4 ;;
esac
# the driver alone on 2 x 2, rank 0's report (its split of the time, the measured memory), each
# run in turn: data parallelism, --shard 1, 2, 3 (the defaults), twice
driverp7()  {
    python bench/cluster.py up --name hzbktd --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.83.0/24
    uptime > $R/driver_2x2p7.load
    for round in 1 2; do
        for shard in "" "--shard 1" "--shard 2" "--shard 3"; do
            echo "# round $round: ${shard:-data parallelism}"
            python bench/cluster.py run --name hzbktd -- python -m collectives.sgd --model wide \
                --subset 384 --epochs 1 --quiet $shard 2>&1 | grep -v "^  \(encode\|eval\|checkpoint\)"
        done
    done > $R/driver_2x2p7.log
    uptime >> $R/driver_2x2p7.load
    python bench/cluster.py down --name hzbktd
}
case "$1" in
    driver2x2p7) driverp7 ;;
esac
# after bench/sharded_step.py limits each rank's BLAS threads as the driver does (limit_threads)
case "$1" in
    steps2x2p8) zpb 2x2p8 2 2 10.199.81.0/24 0,1,2,21,22,5,24,25 3 ;;
    steps4x1p9) zpb 4x1p9 4 1 10.199.82.0/24 0,1,2,21,22,5,24,25 3 ;;
esac
# stage 3 (and 2) blocking against pipelined, with data parallelism, BLAS threads limited
case "$1" in
    steps2x2p10) zpb 2x2p10 2 2 10.199.81.0/24 0,24,25,21,22 3 ;;
    steps4x1p11) zpb 4x1p11 4 1 10.199.82.0/24 0,24,25,21,22 3 ;;
esac
# the defaults (stage 2 per-bucket blocking, stage 3 per-bucket pipelined) with data parallelism
# and stage 1, four rounds, BLAS threads limited
case "$1" in
    steps2x2p12) zpb 2x2p12 2 2 10.199.81.0/24 0,1,21,25 4 ;;
    steps4x1p13) zpb 4x1p13 4 1 10.199.82.0/24 0,1,21,25 4 ;;
esac
# PyTorch beside it, the same session: ZeroRedundancyOptimizer + DDP (gloo) against our
# ShardedOptimizer stage 2 (collectives.torch, not changed by the per-bucket update)
case "$1" in
    torch2x2p14)
        python bench/cluster.py up --name hzbktt --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.84.0/24
        uptime > $R/torch_2x2p14.load
        python bench/cluster.py run --name hzbktt -- python bench/torch_sharded.py --hidden 2048 --steps 5 \
            --rounds 3 --only "ZeroRedundancy,ShardedOptimizer stage 2" --json $R/torch_2x2p14.json > $R/torch_2x2p14.log 2>&1 || true
        uptime >> $R/torch_2x2p14.load
        python bench/cluster.py down --name hzbktt ;;
esac
# ShardedOptimizer stage 1 reduce-scattering (as stage 2) against ZeroRedundancyOptimizer + DDP
# (gloo): torch2x2's command, three launches on one cluster (2026-12-07; run with
# PYTHONPATH=<tree>/src), every configuration of bench/torch_sharded.py
case "$1" in
    torch2x2z1)
        python bench/cluster.py up --name hz1t --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.152.0/24
        python bench/cluster.py run --name hz1t -- python -c "import collectives; print(collectives.__file__)"
        for i in 1 2 3; do
            uptime > $R/torch_2x2z1_$i.load
            nice -n 5 python bench/cluster.py run --name hz1t -- python bench/torch_sharded.py --hidden 2048 \
                --batch 64 --steps 5 --rounds 3 --json $R/torch_2x2z1_$i.json > $R/torch_2x2z1_$i.log 2>&1 || true
            uptime >> $R/torch_2x2z1_$i.load
        done
        python bench/cluster.py down --name hz1t ;;
esac
# the same command before the change (5f84ee5: stage 1 allreduces, then allgathers), ours against
# ZeRO + DDP only, two launches on one cluster, beside the after runs above
case "$1" in
    torch2x2z1before)
        rm -rf /tmp/z1_before && mkdir -p /tmp/z1_before && git archive 5f84ee5 src bench | tar -x -C /tmp/z1_before
        python bench/cluster.py up --name hz1t --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.152.0/24
        for i in 1 2; do
            uptime > $R/torch_2x2z1_before_$i.load
            PYTHONPATH=/tmp/z1_before/src nice -n 5 python bench/cluster.py run --name hz1t -- python \
                /tmp/z1_before/bench/torch_sharded.py --hidden 2048 --batch 64 --steps 5 --rounds 3 \
                --only "ZeroRedundancy,ShardedOptimizer stage" --json $R/torch_2x2z1_before_$i.json \
                > $R/torch_2x2z1_before_$i.log 2>&1 || true
            uptime >> $R/torch_2x2z1_before_$i.load
        done
        python bench/cluster.py down --name hz1t ;;
esac
# fully_shard compressed both ways (top-k 1 % + EF in the reduce-scatter, bf16 parameters in the
# allgather) beside dense and FSDP2 over gloo, 2 x 2 at 1 Gbit/s: torchfs2x2a, torchfs2x2b, ...
torchfs() {  # $1 tag
    python bench/cluster.py up --name hlfs --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.90.0/24
    uptime > $R/torch_fs_$1.load
    python bench/cluster.py run --name hlfs -- python bench/torch_sharded.py --hidden 2048 --steps 5 \
        --rounds 3 --only "fully_shard" --json $R/torch_fs_$1.json > $R/torch_fs_$1.log 2>&1 || true
    uptime >> $R/torch_fs_$1.load
    python bench/cluster.py down --name hlfs
}
case "$1" in
    torchfs2x2*) torchfs "${1#torchfs}" ;;
esac
# stage 1 as ring allreduce's two halves in place (stop 65) against data parallelism, four rounds
case "$1" in
    steps2x2p15) NAME=hlzs zacc 2x2p15 2 2 10.199.92.0/24 0,1 4 ;;
    steps4x1p16) NAME=hlzs zacc 4x1p16 4 1 10.199.93.0/24 0,1 4 ;;
esac
# the defaults after the copy-free ring reduce-scatter and ZeRO 1 in place (stop 65): data
# parallelism, stage 1, stage 2 (per-bucket, blocking) and stage 3 (per-bucket, pipelined)
case "$1" in
    steps2x2p17) NAME=hlzs zacc 2x2p17 2 2 10.199.92.0/24 0,1,21,25 3 ;;
    steps4x1p18) NAME=hlzs zacc 4x1p18 4 1 10.199.93.0/24 0,1,21,25 3 ;;
esac
# PyTorch, every configuration of bench/torch_sharded.py (stop 65): torch4x1a, b, c on 4 hosts
# x 1 rank, torch2x2qa, ... on 2 x 2
torchall() {  # $1 file tag, $2 hosts, $3 ranks per host
    python bench/cluster.py up --name hlt$2 --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet 10.199.9$2.0/24
    uptime > $R/torch_$1.load
    python bench/cluster.py run --name hlt$2 -- python bench/torch_sharded.py --hidden 2048 --steps 5 \
        --rounds 3 --json $R/torch_$1.json > $R/torch_$1.log 2>&1 || true
    uptime >> $R/torch_$1.load
    python bench/cluster.py down --name hlt$2
}
case "$1" in
    torch4x1*) torchall "4x1_${1#torch4x1}" 4 1 ;;
    torch2x2q*) torchall "2x2q_${1#torch2x2q}" 2 2 ;;
esac
# Fourth pass (2026-12-07): the compressed runs with the per-bucket update, beside dense stages
# 2 and 3 and data parallelism (bench/sharded_step.py's CONFIGS 29-32: stage 2 top-k 1 % + EF,
# and with bf16 parameters; stage 3 with both; stage 2 bf16 parameters alone), BLAS threads
# limited; each line of the logs ends with the step's split (compute, exchange, codec) in ms
zc() {  # the same steps as zacc, clusters named hzc...
    NAME=hzc zacc "$@"
}
case "$1" in
    steps2x2c1) zc 2x2c1 2 2 10.199.91.0/24 0,21,29,30,32,25,31 3 ;;
    steps4x1c2) zc 4x1c2 4 1 10.199.92.0/24 0,21,29,30,32,25,31 3 ;;
    # the same after the decode into the replica (Codec.decode(out=))
    steps2x2c6) zc 2x2c6 2 2 10.199.91.0/24 0,21,29,30,32,25,31 3 ;;
    steps4x1c7) zc 4x1c7 4 1 10.199.92.0/24 0,21,29,30,32,25,31 3 ;;
esac
# a top-k threshold hint (22a750f: error feedback's top-k tried the k-th magnitude of the key's
# last selection before sampling; reverted in 607cb6a, no measured gain) against the tree
# without it, on one cluster, launches alternating: "old" runs $OLD_TREE (/work/main: 5f84ee5,
# the code as it stands), "new" this tree (it was 22a750f then), chosen by PYTHONPATH
zcab() {  # $1 tag, $2 hosts, $3 ranks per host, $4 subnet
    python bench/cluster.py up --name hzc$1 --hosts $2 --ranks-per-host $3 --rate 1gbit --subnet $4
    uptime > $R/step_$1.load
    for launch in old1 new1 old2 new2; do
        tree=$([ "${launch%?}" = old ] && echo ${OLD_TREE:-/work/main} || echo $PWD)
        PYTHONPATH=$tree/src python bench/cluster.py run --name hzc$1 -- python bench/sharded_step.py \
            --rounds 2 --only 21,30,29,25,31 --json $R/step_$1_$launch.json -- --model wide \
            --subset 384 --epochs 1 --quiet > $R/step_$1_$launch.log 2>&1
        uptime >> $R/step_$1.load
    done
    python bench/cluster.py down --name hzc$1
}
case "$1" in
    steps2x2c3) zcab 2x2c3 2 2 10.199.93.0/24 ;;
    steps4x1c4) zcab 4x1c4 4 1 10.199.94.0/24 ;;
    # the same comparison for the bf16 decode into the replica (Codec.decode(out=), "new":
    # this tree at the commit that added it) against 5f84ee5 ("old", /work/main)
    steps2x2c5) zcab 2x2c5 2 2 10.199.95.0/24 ;;
esac
# the same four defaults on a quiet machine (stop 65, nothing else running)
case "$1" in
    steps2x2p19) NAME=hlzs zacc 2x2p19 2 2 10.199.92.0/24 0,1,21,25 3 ;;
    steps4x1p20) NAME=hlzs zacc 4x1p20 4 1 10.199.93.0/24 0,1,21,25 3 ;;
esac
# dense and compressed stages 2 and 3 on a quiet machine (stop 65): CONFIGS 21, 30 (top-k 1 % +
# EF, bf16 parameters), 25, 31 (stage 3, both halves compressed)
case "$1" in
    steps2x2p21) NAME=hlzs zacc 2x2p21 2 2 10.199.92.0/24 21,30,25,31 2 ;;
    steps4x1p22) NAME=hlzs zacc 4x1p22 4 1 10.199.93.0/24 21,30,25,31 2 ;;
esac
# ZeRO 1's exchange against the dense one, the tree before stop 65 ($OLD_TREE, a worktree of
# 5f84ee5) and this one in turn, two launches each, 2 x 2 at 1 Gbit/s (zero1_terms_2x2.log)
case "$1" in
    zero1terms)
        python bench/cluster.py up --name hlz1 --hosts 2 --ranks-per-host 2 --rate 1gbit --subnet 10.199.91.0/24
        for i in 1 2; do
            for t in $OLD_TREE $PWD; do
                echo "# launch $i, tree $t, $(uptime)"
                python bench/cluster.py run --name hlz1 -- python $t/bench/plan_dp_terms.py \
                    --model wide --mesh 4,1,1 --repeats 5
            done
        done > $R/zero1_terms_2x2.log 2>&1
        uptime >> $R/zero1_terms_2x2.log
        python bench/cluster.py down --name hlz1 ;;
esac
