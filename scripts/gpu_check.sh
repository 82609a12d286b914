#!/usr/bin/env bash
# The GPU engine's check on one GPU machine, in under 6 minutes: every model captured and equal
# to eager (scripts/gpu_check.py --part checks), a failed capture that leaves the process as it
# was, the CUDA tests, the 2/2-head NTM's, the DNC's and the MANN's training rates, the bench and
# `ntm train copy` on the GPU; then one table against issue 56's targets. Needs Python with
# torch only (no bc; pytest, if installed, adds the CUDA tests of tests/):
#
#     PYTHONPATH=src bash scripts/gpu_check.sh
#
# Each part has its own time limit (6 minutes in all); what they printed stays in $OUT (a new
# temporary folder unless set).
set -u
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
stamp() { date +%s.%N > "$OUT/$1"; }  # start and end times, subtracted in the summary

$PY -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null >> "$OUT/device.txt"

# The CUDA tests compare with the CPU's native NTM engine: its library builds meanwhile.
$PY -c "import torch; from torch_ntm.engines import library
for dtype in (torch.float32, torch.float64): library.available('ntm', dtype)" > "$OUT/build.txt" 2>&1 &

echo "== 1. every model captured, against eager; failed captures (gpu_check.py --part checks)"
timeout 70 $PY scripts/gpu_check.py --part checks > "$OUT/checks.txt" 2>&1
echo "exit $?" >> "$OUT/checks.txt"; grep -v "^RESULT" "$OUT/checks.txt"

echo "== 2. CUDA tests"
wait
if $PY -c "import pytest" 2>/dev/null; then
    timeout 60 $PY -m pytest -q -p no:cacheprovider -k "cuda" tests/test_graphs.py \
        tests/test_model.py tests/test_train.py tests/test_dnc.py > "$OUT/pytest.txt" 2>&1
    echo "pytest exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest.txt" | tail -12
else
    echo "pytest not installed: tests/ skipped" > "$OUT/pytest.txt"; cat "$OUT/pytest.txt"
fi

echo "== 3. training rates of the 2/2-head NTM, the DNC and the MANN (gpu_check.py --part rates)"
timeout 60 $PY scripts/gpu_check.py --part rates > "$OUT/rates.txt" 2>&1
grep -v "^RESULT" "$OUT/rates.txt"

echo "== 4. ntm bench --device cuda"
stamp bench.start
timeout 110 $PY -m torch_ntm bench --device cuda --json > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "exit $?" > "$OUT/bench.exit"; stamp bench.end

echo "== 5. ntm train copy --set device=cuda"
stamp copy.start
timeout 60 $PY -m torch_ntm train copy --set device=cuda --out "$OUT/copy" > "$OUT/copy.txt" 2>&1
echo "exit $?" > "$OUT/copy.exit"; stamp copy.end
grep -E "converged|^ +(20|120) " "$OUT/copy.txt"

echo "== summary ($OUT)"
OUT="$OUT" $PY - <<'PYTHON'
import json, os, re
out = os.environ["OUT"]
def read(name):
    path = os.path.join(out, name)
    return open(path).read() if os.path.exists(path) else ""
def took(part):
    try:
        return float(read(f"{part}.end")) - float(read(f"{part}.start"))
    except ValueError:
        return None
def records(name):
    return [json.loads(l[7:]) for l in read(name).splitlines() if l.startswith("RESULT ")]
# CPU references (one core): the native engine's best training rates on a Zen 5 core, batch 64
# (issue 56), and the MANN's on this project's Zen 4 machine (docs/speed.md).
CPU = {"NTM 2/2 heads": 1176.0, "DNC(9, 8)": 2763.0, "MANN(405, 5)": 249.0}
rows = []
checks = records("checks.txt")
for kind, what in (("model", "models captured and equal to eager"),
                   ("process", "process checks (graph alive, failed captures)")):
    mine = [c for c in checks if c["kind"] == kind]
    failed = [c["check"] for c in mine if not c["passed"]]
    rows.append((what, f"{len(mine) - len(failed)}/{len(mine)} pass"
                 + (f"; failed: {', '.join(failed)[:80]}" if failed else ""), "all pass"))
firsts = [c["first_call_s"] for c in checks if "first_call_s" in c]
if firsts:
    rows.append(("first call (capture), worst model", f"{max(firsts):.1f} s", ""))
counts = {k: re.search(rf"(\d+) {k}", read("pytest.txt")) for k in ("passed", "failed", "skipped", "error")}
counts = {k: int(m.group(1)) if m else 0 for k, m in counts.items()}
rows.append(("pytest -k cuda", ", ".join(f"{v} {k}" for k, v in counts.items() if v)
             or read("pytest.txt").strip()[:60], "all pass, none skipped"))
for r in records("rates.txt"):
    if r["engine"] != "auto":
        continue
    eager = next((e for e in records("rates.txt") if e["engine"] == "eager"
                  and e["rate"] == r["rate"] and e["batch"] == r["batch"]), None)
    ratio = f", {r['per_s'] / eager['per_s']:.1f}x eager" if eager else ""
    cpu = CPU[r["rate"]]
    target = ">= 10x CPU" if r["batch"] in (16, 1024) else ""
    rows.append((f"{r['rate']} train {r['unit']}/s, batch {r['batch']} ({r['runs_on']})",
                 f"{r['per_s']:,.0f} = {r['per_s'] / cpu:.1f}x CPU{ratio}", target))
seconds = took("bench")
rows.append(("ntm bench --device cuda, whole", f"{seconds:.0f} s, {read('bench.exit').strip()}"
             if seconds is not None else "not run", "<= 180 s"))
try:
    bench = json.loads(read("bench.json"))
except ValueError:
    bench = []
for r in bench:
    if r["engine"] == "auto":
        eager = next((e for e in bench if e["engine"] == "eager" and e["batch_size"] == r["batch_size"]), None)
        ratio = f", {r['train_seq_per_s'] / eager['train_seq_per_s']:.1f}x eager" if eager else ""
        rows.append((f"bench train seq/s, batch {r['batch_size']} ({r['runs_as']})",
                     f"{r['train_seq_per_s']:,.0f}{ratio}, warm-up {r['warmup_s']:.1f} s",
                     ">= 20,000" if r["batch_size"] == 1024 else ""))
seconds = took("copy")
rows.append(("ntm train copy --set device=cuda, whole", f"{seconds:.1f} s, {read('copy.exit').strip()}"
             if seconds is not None else "not run", "<= 30 s"))
line = next((l for l in read("copy.txt").splitlines() if re.match(r"^ +120 ", l)), "")
rows.append(("copy model at L = 120 (length, seqs, cost, bit errors, perfect)",
             " ".join(line.split()) or "missing", "0 bit errors"))
width = max(len(r[0]) for r in rows)
print(read("device.txt").strip())
for name, value, target in rows:
    print(f"{name:<{width}}  {value:<52}  {target}")
PYTHON
