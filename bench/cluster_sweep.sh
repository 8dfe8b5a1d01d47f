#!/usr/bin/env bash
# The measurements of docs/benchmarks/cluster.md on one emulated cluster shape (as root; see bench/cluster.py):
#
#   bench/cluster_sweep.sh HOSTS RANKS_PER_HOST RATE [OUTDIR]
#   bench/cluster_sweep.sh 2 2 1gbit               # -> docs/results/cluster/*_2x2_1gbit.*
#
# builds the cluster, then on it: the bandwidth matrix (osu_bw --matrix, every ordered pair of
# ranks), collectives-tune (the two-level model's fit and the rules auto follows), every allreduce
# algorithm and native from 8 B to 64 MiB (osu_allreduce --algorithm all; auto follows the tuning
# file just written), the model's error table, the summary (bench/cluster_report.py) and the figure; and takes the cluster down (also on failure or Ctrl-C). PYTHON defaults to the
# Python of .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=${1:?hosts}; per=${2:?ranks per host}; rate=${3:?rate}; out=${4:-docs/results/cluster}
py=${PYTHON:-.venv/bin/python}
tag=${hosts}x${per}_${rate}
name=sweep-${hosts}x${per}-${rate}
mkdir -p "$out"
cluster() { "$py" bench/cluster.py "$@"; }
trap 'cluster down --name "$name"' EXIT
cluster up --name "$name" --hosts "$hosts" --ranks-per-host "$per" --rate "$rate"
on() { cluster run --name "$name" -- "$@"; }

on osu_bw --matrix -i 5 -x 1 --no-progress --json "$out/bw_matrix_$tag.json"
on osu_latency --matrix --sizes 8 -i 200 -x 20 --no-progress --json "$out/lat_matrix_$tag.json"
rm -f "$out/tuning_$tag.json"
on collectives-tune -o "$out/tuning_$tag.json"
COLLECTIVES_TUNING_FILE=$out/tuning_$tag.json on osu_allreduce --algorithm all --busbw -T mpi_float --no-progress \
  --sizes 8,64,512,4K,32K,256K,1M,4M,16M,64M -i 50 -x 5 --iterations-large 5 --warmup-large 1 \
  --json "$out/allreduce_$tag.json"
"$py" -m collectives.tools.osu.plot "$out/allreduce_$tag.json" --model "$out/tuning_$tag.json" \
  --errors > "$out/errors_$tag.md"
"$py" -m collectives.tools.osu.plot "$out/allreduce_$tag.json" --table > "$out/table_$tag.md"
"$py" bench/cluster_report.py "$out/allreduce_$tag.json" --model "$out/tuning_$tag.json" \
  > "$out/summary_$tag.md"
"$py" -m collectives.tools.osu.plot "$out/allreduce_$tag.json" --model "$out/tuning_$tag.json" \
  -o "$out/allreduce_$tag.png" --title "allreduce on $hosts hosts x $per ranks, $rate links"
