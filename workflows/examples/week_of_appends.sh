#!/usr/bin/env bash
# A week of daily drops through the retrain workflow (data.append: true), as workflows/README.md
# shows it: scikit-learn's digits split into 7 daily Parquet files; each "night" one file
# arrives and the job runs; day 3 runs twice (nothing new), day 5 also gets a file with a new
# class value (refused); then the production model's lineage. About 2 minutes on 2 cores.
#
#   bash workflows/examples/week_of_appends.sh [WORK_DIR]    (default: a new temporary dir)
set -uo pipefail
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=3
W=${1:-$(mktemp -d -t dvml-week-XXXX)}; mkdir -p "$W/drops" "$W/state"
echo "working in $W"
python - "$W" <<'PY'
import os, sys, pathlib, numpy as np, pandas as pd
from sklearn.datasets import load_digits
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tf_keras as keras
w = pathlib.Path(sys.argv[1])
d = load_digits()
days = np.array_split(np.arange(len(d.target)), 7)
for day, idx in enumerate(days, start=1):
    pd.DataFrame({"pixels": list(d.data[idx].astype("float32")), "label": d.target[idx]}
                 ).to_parquet(w / f"day-{day:02d}.parquet.pending")
model = keras.Sequential([keras.layers.InputLayer(input_shape=(64,)),
                          keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
(w / "mlp.json").write_text(model.to_json())
PY
cat > "$W/digits.yaml" <<YAML
name: digits
state_dir: $W/state
registry: sqlite:///$W/registry.db
data:
  source: $W/drops/
  x: pixels
  y: label
  normalizing_const: 16.0
  append: true
validation:
  split: 0.2
model:
  architecture: $W/mlp.json
  compile_params: "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
  fit_params: "batch_size=32, epochs=1"
  num_iterations: 2
  warm_start: true
promotion:
  metric: accuracy
YAML
export DASK_DVML__CLUSTER__STATE_DIR=$W/cluster-state
echo "=== dvml cluster up"
python -m dvml cluster up --n-workers 2 --vineyard-memory 256MiB --dashboard-address none 2>&1 | grep -v "^[WIE]0000\|^WARNING: All log\|cuda" | head -8
trap 'python -m dvml cluster down >/dev/null 2>&1' EXIT
for d in 1 2 3 4 5 6 7; do
  f=$(printf "day-%02d.parquet" $d)
  mv "$W/$f.pending" "$W/drops/$f"
  echo "=== day $d: $f dropped"
  python -m workflows.retrain --config "$W/digits.yaml" 2>&1 | grep -E " INFO | ERROR | WARNING " | sed -E 's/^[0-9T:+-]+ workflows.retrain\[[0-9]+\] //'
  if [ $d = 5 ]; then
    echo "=== day 5, later: a file with a new class value (10) arrives"
    python - "$W" <<'PY'
import sys, pathlib
w = pathlib.Path(sys.argv[1])
import pandas as pd
from sklearn.datasets import load_digits
d = load_digits()
bad = pd.DataFrame({"pixels": list(d.data[:20].astype("float32")), "label": d.target[:20]})
bad.loc[0, "label"] = 10
bad.to_parquet(w / "drops" / "day-05-extra.parquet")
PY
    python -m workflows.retrain --config "$W/digits.yaml" 2>&1 | grep -E " INFO | ERROR " | sed -E 's/^[0-9T:+-]+ workflows.retrain\[[0-9]+\] //'
    echo "=== (the file is moved aside)"
    mv "$W/drops/day-05-extra.parquet" "$W/"
  fi
  if [ $d = 3 ]; then
    echo "=== day 3, again: no new file"
    python -m workflows.retrain --config "$W/digits.yaml" 2>&1 | grep -E " INFO | ERROR " | sed -E 's/^[0-9T:+-]+ workflows.retrain\[[0-9]+\] //'
  fi
done
echo "=== dvml models lineage digits"
python -m dvml models lineage digits --registry "sqlite:///$W/registry.db" 2>&1 | grep -v "^ *buffer [0-9]*:\|^ *file://" | head -80
