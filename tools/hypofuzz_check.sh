#!/usr/bin/env bash
# HypoFuzz hands its failures to kvarena fuzz (docs/guides/verifying.md "Beyond one machine").
#
# In a fresh venv with the [fuzz] extra (HypoFuzz and the Hypothesis it needs), with planted's
# holes-not-credited bug laid out in a copy of the package: `hypothesis fuzz` on that copy's
# kvarena/verification/fuzz_targets.py until both machines have a failure stored under their
# database key, then one-example `kvarena fuzz --db` rounds against that database, which must
# fail on their first example.  Not in CI: the [fuzz] extra pins an older Hypothesis than the
# test extra.  Usage: tools/hypofuzz_check.sh [SECONDS]   (default 600: the fuzzing's limit)
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-600}
work=$(mktemp -d /tmp/kvarena-hypofuzz.XXXXXX)
echo "== work folder $work"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # no fuzzer outlives the check
python3 -m venv "$work/venv" && . "$work/venv/bin/activate"
pip install -q torch==2.13.0 && pip install -q -e ".[fuzz]"
python - "$work/planted" <<'PY'
import sys
from pathlib import Path
from kvarena.verification import planted
planted.mutated_copy(planted.by_name("holes-not-credited"), Path(sys.argv[1]))
PY
export PYTHONPATH="$work/planted" KVARENA_FUZZ_DB="$work/db"
cd "$work"  # from here on `import kvarena` is the planted copy, not the checkout's folder
python -c "import kvarena, sys; assert kvarena.__file__.startswith(sys.argv[1]), kvarena.__file__" "$work/planted"
echo "== hypothesis fuzz (HypoFuzz $(pip show hypofuzz | sed -n 's/^Version: //p'), Hypothesis $(pip show hypothesis | sed -n 's/^Version: //p'))"
start=$(date +%s)
# One target at a time (one HypoFuzz run fuzzing both stopped once the first had failed), each
# until its machine's own key, the one kvarena fuzz reads, holds an example.
for target in TestDifferentialComposites:differential_composites TestDifferentialArena:differential; do
    hypothesis fuzz -n 1 --no-dashboard -- planted/kvarena/verification/fuzz_targets.py -k "${target%%:*}" \
        > "hypofuzz-${target%%:*}.log" 2>&1 &
    fuzzer=$!
    python - "$limit" "${target##*:}" <<'PY'
import os, sys, time
from kvarena.verification import fuzz
mod = __import__(f"kvarena.verification.{sys.argv[2]}", fromlist=["machine_for"])
key = fuzz.database_key(mod.machine_for("cpu"))
db, t0 = fuzz.open_database(os.environ["KVARENA_FUZZ_DB"]), time.time()
while not list(db.fetch(key)):
    if time.time() - t0 > float(sys.argv[1]):
        sys.exit(f"hypofuzz_check: no {sys.argv[2]} failure stored in {sys.argv[1]} s")
    time.sleep(5)
print(f"   {sys.argv[2]}: a failure stored under its key after {time.time() - t0:.0f} s", flush=True)
PY
    kill "$fuzzer" 2>/dev/null || true
    wait "$fuzzer" 2>/dev/null || true
done
echo "== kvarena fuzz --db, one example a machine, $(( $(date +%s) - start )) s after the fuzzing started"
python - <<'PY'
import os, sys
from kvarena.verification import fuzz
db = fuzz.open_database(os.environ["KVARENA_FUZZ_DB"])
bad = []
for machine in ("core", "composites"):
    r = fuzz.run_round(machine, examples=1, database=db, shrink=False)
    error = (r["failure"] or {}).get("error", "")
    print(f"   {machine}: {r['examples']} examples run; failure: {error[:120] or 'none'}")
    bad += [] if error and r["examples"] <= 2 else [machine]
sys.exit(f"hypofuzz_check: not replayed at once: {bad}" if bad else 0)
PY
echo "== ok: every failure HypoFuzz stored was kvarena fuzz's first example"
