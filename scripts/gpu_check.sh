#!/usr/bin/env bash
# The GPU engine's check on one GPU machine: the CUDA tests, the bench, `ntm train copy` on the
# GPU and a MANN training loop, then one summary table. Needs Python with torch only (pytest, if
# installed, adds the CUDA tests of tests/):
#
#     PYTHONPATH=src bash scripts/gpu_check.sh
#
# Each part has its own time limit (6 minutes in all at most); what they printed stays in $OUT
# (a new temporary folder unless set). CPU reference figures for the ratios: the README's.
set -u
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python}
mkdir -p "$OUT"
now() { date +%s.%N; }

$PY -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"

echo "== 1. CUDA tests"
if $PY -c "import pytest" 2>/dev/null; then
    timeout 90 $PY -m pytest -q -p no:cacheprovider -k "cuda or graphs" tests/test_graphs.py \
        tests/test_model.py tests/test_train.py > "$OUT/pytest.txt" 2>&1
    echo "pytest exit $?"; tail -3 "$OUT/pytest.txt"
else
    echo "pytest not installed: tests/ skipped (scripts/gpu_check.py's checks below run)" \
        > "$OUT/pytest.txt"; cat "$OUT/pytest.txt"
fi
timeout 90 $PY scripts/gpu_check.py --part checks 2>&1 | tee "$OUT/checks.txt"

echo "== 2. ntm bench --device cuda"
start=$(now)
timeout 180 $PY -m torch_ntm bench --device cuda --batch-size 1,16,256,1024 --memory-size 128 \
    --json > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "bench exit $? after $(echo "$(now) - $start" | bc) s" | tee "$OUT/bench.time"

echo "== 3. ntm train copy --set device=cuda"
start=$(now)
timeout 120 $PY -m torch_ntm train copy --set device=cuda --out "$OUT/copy" > "$OUT/copy.txt" 2>&1
echo "train exit $? after $(echo "$(now) - $start" | bc) s" | tee "$OUT/copy.time"
grep -E "converged|^ +(20|120) " "$OUT/copy.txt"

echo "== 4. MANN training loop"
timeout 60 $PY scripts/gpu_check.py --part mann 2>&1 | tee "$OUT/mann.txt"

echo "== summary ($OUT)"
OUT="$OUT" $PY - <<'PYTHON'
import json, os, re
out = os.environ["OUT"]
def read(name):
    path = os.path.join(out, name)
    return open(path).read() if os.path.exists(path) else ""
# CPU references: the README's native figures on the 2-core machine (copy model, N = 128).
CPU_BEST_TRAIN = 1521.0  # native training sequences/s, batch 64 (docs/speed.md's table)
CPU_MANN = 249.0  # MANN(405, 5) episodes/s, batch 16, default (native) engine
rows = []
checks = [json.loads(l[7:]) for l in read("checks.txt").splitlines() if l.startswith("RESULT ")]
rows.append(("CUDA checks (gpu_check.py)", f"{sum(c['passed'] for c in checks)}/{len(checks)} pass",
             "all pass"))
if checks:
    rows.append(("first call of a bucket (capture), worst", f"{max(c['first_call_s'] for c in checks):.1f} s", "<= 10 s"))
counts = {k: re.search(rf"(\d+) {k}", read("pytest.txt")) for k in ("passed", "failed", "skipped")}
counts = {k: int(m.group(1)) if m else 0 for k, m in counts.items()}
rows.append(("pytest CUDA and graphs tests", ", ".join(f"{v} {k}" for k, v in counts.items())
             if any(counts.values()) else read("pytest.txt").strip()[:60], "all pass, none skipped"))
rows.append(("bench whole", read("bench.time").strip(), "<= 180 s"))
try:
    bench = json.loads(read("bench.json"))
except ValueError:
    bench = []
for r in bench:
    if r["engine"] == "auto":
        eager = next((e for e in bench if e["engine"] == "eager" and e["batch_size"] == r["batch_size"]), None)
        ratio = f", {r['train_seq_per_s'] / eager['train_seq_per_s']:.1f}x eager" if eager else ""
        target = {1024: ">= 20,000", 256: f">= {5 * CPU_BEST_TRAIN:,.0f} (5x CPU)"}.get(r["batch_size"], "")
        rows.append((f"bench train seq/s, batch {r['batch_size']} ({r['runs_as']})",
                     f"{r['train_seq_per_s']:,.0f}{ratio}, warm-up {r['warmup_s']:.1f} s", target))
rows.append(("ntm train copy --set device=cuda", read("copy.time").strip(), "<= 30 s"))
line = next((l for l in read("copy.txt").splitlines() if re.match(r"^ +120 ", l)), "")
rows.append(("copy model at L = 120 (length, seqs, cost, bit errors, perfect)", " ".join(line.split()) or "missing", "0 bit errors"))
mann = {json.loads(l[7:])["mann_engine"]: json.loads(l[7:]) for l in read("mann.txt").splitlines() if l.startswith("RESULT ")}
if "auto" in mann:
    rows.append((f"MANN episodes/s ({mann['auto']['runs_on']})", f"{mann['auto']['episodes_per_s']:,.0f} = {mann['auto']['episodes_per_s'] / CPU_MANN:.1f}x CPU", f">= {10 * CPU_MANN:,.0f} (10x CPU)"))
if "eager" in mann:
    rows.append(("MANN episodes/s (eager)", f"{mann['eager']['episodes_per_s']:,.0f}", ""))
width = max(len(r[0]) for r in rows)
for name, value, target in rows:
    print(f"{name:<{width}}  {value:<44}  {target}")
PYTHON
