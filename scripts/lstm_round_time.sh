#!/usr/bin/env bash
# Seconds per round of lstm_shakespeare in both engines (10 roles a round, batch 10, one local epoch).
#   scripts/lstm_round_time.sh [DATA_ROOT] [extra overrides, e.g. device=cuda]
# DATA_ROOT/shakespeare/all_data/*.json: LEAF's files; when absent, a stand-in in LEAF's format is written
# there (100 roles of 300 samples of random text: the same shapes and work per sample as the real data).
set -euo pipefail
root=${1:-/tmp/fedagg-shakespeare}
shift || true
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if ! ls "$root"/shakespeare/all_data/*.json >/dev/null 2>&1; then
  python - "$root" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from fedagg.data.leaf import VOCABULARY
rng, users = np.random.default_rng(0), {}
for r in range(100):
    text = "".join(VOCABULARY[i] for i in rng.integers(0, len(VOCABULARY), 300 + 80))
    users[f"ROLE{r}"] = {"x": [text[i:i + 80] for i in range(300)], "y": [text[i + 80] for i in range(300)]}
folder = Path(sys.argv[1], "shakespeare", "all_data")
folder.mkdir(parents=True, exist_ok=True)
(folder / "all_data.json").write_text(json.dumps({"users": list(users), "user_data": users}))
PY
fi
for engine in sequential parallel; do
  dir=/tmp/fedagg-lstm-time/$engine
  python -m fedagg.run dataset=shakespeare model=lstm_shakespeare data.root="$root" num_clients=null \
    clients_per_round=10 rounds=4 client.batch_size=10 client.local_epochs=1 engine=$engine \
    hydra.run.dir=$dir overwrite=true "$@" >/dev/null 2>&1
  python - "$dir" "$engine" <<'PY'
import csv, statistics, sys
t = [float(r["elapsed_s"]) for r in csv.DictReader(open(f"{sys.argv[1]}/metrics.csv"))]
print(f"{sys.argv[2]:10s} {statistics.median(b - a for a, b in zip(t, t[1:])):.2f} s/round (median of rounds 2-{len(t)})")
PY
done
