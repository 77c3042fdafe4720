#!/usr/bin/env bash
# scripts/same_results.sh WORKTREE OUTDIR [DATA_ROOT]: 15 single fedagg runs and one 12-job stacked sweep from WORKTREE's code,
# each into its own folder under OUTDIR. One process at a time, one torch thread, with the python on PATH (the
# project's environment active). DATA_ROOT: where MNIST is (default: $FEDAGG_DATA, else ./data, as fedagg's data.root).
set -u
if [ $# -lt 2 ]; then echo "usage: $0 WORKTREE OUTDIR [DATA_ROOT]" >&2; exit 2; fi
DATA=$(cd "${3:-${FEDAGG_DATA:-data}}" && pwd) || exit 2
WT=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && OUT=$(cd "$2" && pwd) || exit 2
if [ -n "$(ls -A "$OUT")" ]; then echo "$OUT is not empty: refusing" >&2; exit 2; fi
mkdir -p "$OUT/_logs"

export PYTHONPATH="$WT" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONHASHSEED=0
unset FEDAGG_DATA
cd "$WT" || exit 2
python -c "import fedagg, hydra_plugins.fedagg_stacked_launcher.stacked_launcher as s; print('fedagg from', fedagg.__file__); print('stacked launcher from', s.__file__)" | tee "$OUT/_logs/imports.txt"
git -C "$WT" rev-parse HEAD > "$OUT/_logs/commit.txt"
git -C "$WT" status --short > "$OUT/_logs/git_status.txt"

# 3 rounds (60 x 0.05), 5 % of every client's data and of the test set, 5 of 10 clients a round, a checkpoint every round
COMMON=(dataset=mnist "data.root=$DATA" experiment_scale=0.05 rounds=60 num_clients=10 clients_per_round=5
        checkpoint_every=1)
FAILED=0
T0=$(date +%s.%N)
run() {  # run NAME OVERRIDES...
  local name=$1; shift
  local t=$(date +%s.%N)
  python -m fedagg.run "${COMMON[@]}" seed=0 "$@" "hydra.run.dir=$OUT/$name" > "$OUT/_logs/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && FAILED=1
  printf '%-16s rc=%d %6.1f s  %s\n' "$name" $rc "$(awk "BEGIN{print $(date +%s.%N) - $t}")" "$*" | tee -a "$OUT/_logs/times.txt"
}
run fedavg       aggregator=fedavg
run fedadam      aggregator=fedadam
run fedexp       aggregator=fedexp
run fedawa       aggregator=fedawa
run ewwa         aggregator=ewwa
run scaffold     aggregator=scaffold
run feddyn       aggregator=feddyn
run fednova      aggregator=fednova
run fedcams      aggregator=fedcams
run fednnnn      aggregator=fednnnn
run median_alie  aggregator=median attack=alie
run krum         aggregator=krum
run topk         channel=topk
# noise_multiplier 0.01: the default z=1 (noise norm ~258 on 1.66M parameters, K=5) diverges in round 2
run dp           channel=dp channel.dp.noise_multiplier=0.01
run qsgd_dp      'channel=[qsgd,dp]' channel.dp.noise_multiplier=0.01

# one stacked sweep: 3 aggregators x 2 seeds x 2 alphas = 12 jobs, one group; model=cnn_small (convolutions, 21,840
# parameters): the default cnn_mnist took 312 s stacked on one thread, cnn_small about 36 s
t=$(date +%s.%N)
python -m fedagg.run -m hydra/launcher=stacked engine=parallel model=cnn_small "${COMMON[@]}" \
  aggregator=fedavg,fedadam,fedyogi seed=0,1 partition.alpha=0.1,0.5 \
  "hydra.sweep.dir=$OUT/stacked" > "$OUT/_logs/stacked.log" 2>&1
rc=$?
[ $rc -ne 0 ] && FAILED=1
printf '%-16s rc=%d %6.1f s\n' stacked $rc "$(awk "BEGIN{print $(date +%s.%N) - $t}")" | tee -a "$OUT/_logs/times.txt"
grep -h "train together\|runs alone" "$OUT/_logs/stacked.log" | tee -a "$OUT/_logs/times.txt"
printf 'total %.1f s\n' "$(awk "BEGIN{print $(date +%s.%N) - $T0}")" | tee -a "$OUT/_logs/times.txt"
exit $FAILED
