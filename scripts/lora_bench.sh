#!/usr/bin/env bash
# The low-rank-adapter rules measured on one CPU (docs/explanations/lora-measured.md), into one folder:
#   1. a base: vit_tiny (14x14 MNIST, 7x7 patches) pretrained centrally on MNIST's digits 0-4 only;
#   2. federated fine-tuning from it on all ten digits (10 clients, Dirichlet(0.1) labels, a tenth of MNIST):
#      the seven adapter rules at rank 8 (homo/) and at ranks drawn from [2,4,8] (hetero/), and FedAvg
#      fine-tuning the whole model (full/), on the same seeds (stacked sweeps);
#   3. the tables (mean and 95% interval per rule, paired differences to FedIT) and the figure of the
#      aggregation error per round;
#   4. the fair comparison of the seven rules at a small budget (compare/).
#
#   scripts/lora_bench.sh [OUT_DIR]          # default outputs/lora_bench; MNIST from $FEDAGG_DATA (else ./data)
# Smaller: LORA_BENCH_ROUNDS (10), LORA_BENCH_SEEDS (0,1,2), LORA_BENCH_SCALE (0.1: the share of MNIST the
# clients and the test set keep), LORA_BENCH_BASE_SAMPLES (10000), LORA_BENCH_BUDGET (3 trials a method),
# LORA_BENCH_CONFIRM (2 seeds). LORA_BENCH_STEPS (default "pretrain homo hetero full tables compare") runs those
# steps only.
# Every step is resumed: the same command on the same folder finishes what an
# interrupted one left and redoes nothing (the base file is kept, finished runs are skipped).
set -euo pipefail
out=${1:-outputs/lora_bench}
rounds=${LORA_BENCH_ROUNDS:-10}
seeds=${LORA_BENCH_SEEDS:-0,1,2}
scale=${LORA_BENCH_SCALE:-0.1}
base_samples=${LORA_BENCH_BASE_SAMPLES:-10000}
budget=${LORA_BENCH_BUDGET:-3}
confirm=${LORA_BENCH_CONFIRM:-2}
rules=fedit,ffa_lora,fedsa_lora,flora,fedex_lora,flexlora,hetlora
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$out"

timed() {  # timed NAME COMMAND...: run it, then print (and keep in times.txt) how long it took
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "wall time $name: $((SECONDS - start)) s" | tee -a "$out/times.txt"
}

# the setting (vit_tiny on 14x14 MNIST, 10 clients, Dirichlet(0.1), local epochs) is scripts/lora_conf/experiment/lora_mnist.yaml;
# experiment_scale shrinks the rounds too (rounds x scale are trained): ask for rounds / scale
scaled_rounds=$(python -c "import math, sys; print(math.ceil(int(sys.argv[1]) / float(sys.argv[2])))" "$rounds" "$scale")
model=(model=vit_tiny model.input_size=14 model.patch_size=7)
conf=$(cd "$(dirname "$0")" && pwd)/lora_conf
common=(hydra.searchpath=["file://$conf"] +experiment=lora_mnist model.pretrained="$out/base.pt" experiment_scale="$scale")
lora=(adapter=lora adapter.rank=8)

steps=" ${LORA_BENCH_STEPS:-pretrain homo hetero full tables compare} "
step() { [[ $steps == *" $1 "* ]]; }

if ! step pretrain; then
    :
elif [[ -f $out/base.pt ]]; then
    echo "base $out/base.pt kept (delete it to pretrain again)"
else
    timed pretrain python -m fedagg.pretrain "${model[@]}" dataset=mnist classes=[0,1,2,3,4] epochs=1 \
        max_samples="$base_samples" out="$out/base.pt"
fi
stacked=(-m hydra/launcher=stacked engine=parallel resume=true seed="$seeds" rounds="$scaled_rounds")
step homo && timed sweep_homo python -m fedagg.run "${stacked[@]}" "${common[@]}" "${lora[@]}" aggregator="$rules" \
    table.ranks=homo hydra.sweep.dir="$out/sweeps/homo"
step hetero && timed sweep_hetero python -m fedagg.run "${stacked[@]}" "${common[@]}" "${lora[@]}" adapter.rank_choices=[2,4,8] \
    aggregator="$rules" table.ranks=hetero hydra.sweep.dir="$out/sweeps/hetero"
# FedAvg trains the whole model, ranks or not: the same runs stand in both columns of the table
step full && timed sweep_full python -m fedagg.run "${stacked[@]}" "${common[@]}" adapter=none aggregator=fedavg \
    table.ranks=homo,hetero hydra.sweep.dir="$out/sweeps/full"

# tables: each mean over the seeds with its 95% interval, and the paired differences to FedIT with theirs (table.md);
# the figure: each rule's aggregation error per round (agg_error.png), beside accuracy.png
step tables && timed tables python -m fedagg.results table "$out/sweeps" --spread ci95 --baseline fedit
step tables && timed figures python -m fedagg.results plot "$out/sweeps" --curve agg_error --wandb-mode disabled

# the fair comparison of the seven rules, at rank 8: every rule tuned alike (its defaults and budget-1 more trials
# on the clients' validation splits), then confirmed on fresh seeds; half the rounds, for its many runs
compare_rounds=$(python -c "import math, sys; print(math.ceil(int(sys.argv[1]) / 2 / float(sys.argv[2])))" "$rounds" "$scale")
step compare && timed compare python -m fedagg.compare methods=["$rules"] baseline=fedit budget="$budget" confirm_seeds="$confirm" \
    batch="$budget" hydra/launcher=stacked engine=parallel "${common[@]}" rounds="$compare_rounds" "${lora[@]}" \
    hydra.sweep.dir="$out/compare"
echo "written: $out/sweeps/table.md, $out/sweeps/agg_error.png, $out/compare/report.html; wall times in $out/times.txt"
