#!/usr/bin/env bash
# Wall time of a sweep trained together (hydra/launcher=stacked) against its jobs one after another, and the
# parallel engine on unequal clients (cross_silo) before and after per-client CPU convolutions. Run it on a
# quiet machine; every table and log goes to OUT_DIR.
#   bash scripts/bench_stacked.sh cpu [OUT_DIR]   # the CPU figures (one thread; about 30-60 min on 2 cores)
#   bash scripts/bench_stacked.sh gpu [OUT_DIR]   # 64 jobs of MNIST cnn_small cross-device (scripts/gpu_check.sh)
# FEDAGG_DATA: the folder holding MNIST/raw (default ./data, as fedagg's data.root); PYTHON: the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?cpu or gpu}
out=${2:-${OUT:-bench_stacked}}
data=${FEDAGG_DATA:-data}
py=${PYTHON:-python3}
mkdir -p "$out"

timed() {  # NAME ARGS...: run a sweep, keep its log, print and record its wall time
  local name=$1; shift
  rm -rf "$out/$name"
  local start=$(date +%s%N)
  "$py" -m fedagg.run -m "$@" "hydra.sweep.dir=$out/$name" > "$out/$name.log" 2>&1
  local rc=$? end=$(date +%s%N)
  local ms=$(( (end - start) / 1000000 ))
  echo "$name: $((ms / 1000)).$(printf %03d $((ms % 1000))) s (exit $rc; $(grep -o 'sweep .*: .*' "$out/$name.log" | tail -1))" | tee -a "$out/times.txt"
}

# a sweep of jobs one after another vs stacked: same jobs, same folders' contents (results equal)
cross_device="dataset=mnist model=cnn_small partition=iid partition.samples_per_client=60 num_clients=1000
  clients_per_round=100 client.batch_size=10 data.root=$data"
if [ "$mode" = cpu ]; then
  export OMP_NUM_THREADS=1
  digits="aggregator=fedavg,fedavgm,fedadam,scaffold seed=0,1,2,3,4,5 device=cpu"
  # 24 default-run jobs (digits MLP, 30 rounds): the basic launcher as a user runs it (engine=auto: sequential on
  # the CPU), the basic launcher with the parallel engine, and stacked
  timed digits24_basic_auto $digits
  timed digits24_basic_parallel $digits engine=parallel
  timed digits24_stacked $digits engine=parallel hydra/launcher=stacked
  # 8 jobs of cross_device (MNIST, cnn_small, 1000 clients, 100 a round), 5 rounds each
  timed cross_device8_basic $cross_device seed=0,1,2,3,4,5,6,7 rounds=5 device=cpu engine=parallel
  timed cross_device8_stacked $cross_device seed=0,1,2,3,4,5,6,7 rounds=5 device=cpu engine=parallel hydra/launcher=stacked
  # cross_silo (10 Dirichlet clients of LeNet): parallel/sequential before (grouped convolutions) and after
  "$py" scripts/bench.py --workloads cross_silo --device cpu --threads 1 --rounds 3 --data-root "$data" --grouped-conv \
    > "$out/cross_silo_before.txt" 2>&1
  "$py" scripts/bench.py --workloads cross_silo --device cpu --threads 1 --rounds 3 --data-root "$data" \
    > "$out/cross_silo_after.txt" 2>&1
  tail -n 6 "$out/cross_silo_before.txt" "$out/cross_silo_after.txt"
elif [ "$mode" = gpu ]; then
  seeds=$(seq -s, 0 63)
  # 64 jobs of MNIST cnn_small cross-device (engine=auto is the parallel engine on a GPU), 3 rounds each
  timed cross_device64_stacked $cross_device seed=$seeds rounds=3 device=cuda hydra/launcher=stacked
  timed cross_device64_basic $cross_device seed=$seeds rounds=3 device=cuda
else
  echo "mode: cpu or gpu" >&2; exit 2
fi
