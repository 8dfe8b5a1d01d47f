#!/usr/bin/env bash
# Every run behind docs/benchmarks/cluster.md, "Time to accuracy, 625 steps" (issue 24), as run
# (as root, from the repository root, on a quiet machine, one run at a time). Each run writes
# NAME.json (--log) and NAME.log (its report); first/ holds the first round (before the one-pass
# optimizer and PowerSGD without temporaries), with the DGC and --overlap runs made only there.
# Table and plot: python bench/time_to_accuracy.py --reference dense.json runs... --plot out.png
set -u
PY=.venv/bin/python
OUT=docs/results/cluster/tta
C="$PY bench/cluster.py"
S="$PY -m collectives.sgd --dataset synthetic --model wide --quiet"
T="$PY -m collectives.torch.train --dataset synthetic --width 64 --hidden 4096 --batch-size 128 --epochs 5"
run() { # cluster, name, command...
  local name=$1 tag=$2; shift 2
  timeout 1500 $C run --name $name -- "$@" --log $OUT/$tag.json > $OUT/$tag.log 2>&1
}
$C up --name tta --hosts 2 --ranks-per-host 2 --rate 1gbit
run tta dense_hier_2x2_1gbit $S --epochs 5 --algorithm hierarchical
run tta topk1_ef_hier_2x2_1gbit $S --epochs 5 --algorithm hierarchical --codec topk:ratio=0.01
run tta powersgd4_hier_2x2_1gbit $S --epochs 5 --algorithm hierarchical --codec powersgd:rank=4
# first round only (first/):
#   $S --epochs 5 --algorithm hierarchical --codec dgc:density=0.01 --momentum-correction --sparsity-warmup 1
#   $S --epochs 5 --algorithm hierarchical --codec topk:ratio=0.01 --overlap
run tta torch_dense_hier_2x2_1gbit $T --algorithm hierarchical
run tta torch_ddp_gloo_2x2_1gbit $T --exchange ddp
run tta torch_topk1_ef_hier_2x2_1gbit $T --algorithm hierarchical --codec topk:ratio=0.01 --error-feedback
run tta torch_powersgd4_hier_2x2_1gbit $T --algorithm hierarchical --codec powersgd:rank=4
$C down --name tta
$C up --name tta41 --hosts 4 --ranks-per-host 1 --rate 1gbit
run tta41 dense_ring_4x1_1gbit $S --epochs 1 --algorithm ring
run tta41 topk1_ef_ring_4x1_1gbit $S --epochs 1 --algorithm ring --codec topk:ratio=0.01
run tta41 powersgd4_ring_4x1_1gbit $S --epochs 1 --algorithm ring --codec powersgd:rank=4
$C down --name tta41
$C up --name tta21 --hosts 2 --ranks-per-host 1 --rate 1gbit
run tta21 dense_ring_2x1_1gbit $S --epochs 1 --algorithm ring
run tta21 topk1_ef_ring_2x1_1gbit $S --epochs 1 --algorithm ring --codec topk:ratio=0.01
run tta21 powersgd4_ring_2x1_1gbit $S --epochs 1 --algorithm ring --codec powersgd:rank=4
$C down --name tta21
# 10 Gbit/s, auto against dense, interleaved, 125 steps each
S10="$S --epochs 1 --algorithm hierarchical"
$C up --name tta10 --hosts 2 --ranks-per-host 2 --rate 10gbit
for i in 1 2; do
  run tta10 dense_hier_2x2_10gbit_$i $S10
  run tta10 auto_topk1_hier_2x2_10gbit_$i $S10 --codec auto:topk:ratio=0.01
done
$C down --name tta10
