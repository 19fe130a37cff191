#!/usr/bin/env bash
# Sums the doctest summary lines of a meson test log into one plain line that CI and
# scripts/test-versions.sh read:  doctest: P passed, F failed, S skipped
# (skipped: cases that did not run here, e.g. the CUDA suite on a machine without a GPU).
# Before it, one block per failed check (its test case, the check and its values), so that the
# last lines of a CI log, all that CI shows, name what failed.
#   bash scripts/doctest-totals.sh build/meson-logs/testlog.txt
set -euo pipefail
exec python3 - "$1" <<'PY'
import re, sys
passed = failed = skipped = 0
case, failures, pending = None, [], None
for line in open(sys.argv[1], errors="replace"):
    line = line.rstrip("\n")
    m = re.search(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped", line)
    if m:
        passed += int(m.group(2)); failed += int(m.group(3)); skipped += int(m.group(4))
        continue
    if line.startswith("TEST CASE:"):
        case = line[len("TEST CASE:"):].strip()
    elif re.search(r": (ERROR|FATAL ERROR): ", line):
        pending = [f"  case:  {case}", f"  check: {line.strip()}"]
        failures.append(pending)
    elif pending is not None and line.strip().startswith(("values:", "logged:", "CHECK", "REQUIRE")):
        if len(pending) < 8:
            pending.append(f"         {line.strip()[:300]}")
    elif not line.strip():
        pending = None
if failures:
    print(f"doctest: {len(failures)} failed check(s):")
    for f in failures[:10]:
        print("\n".join(f))
print(f"doctest: {passed} passed, {failed} failed, {skipped} skipped")
PY
