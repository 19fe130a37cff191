#!/usr/bin/env bash
# Sums the doctest summary lines of a meson test log into one plain line that CI and
# scripts/test-versions.sh read:  doctest: P passed, F failed, S skipped
# (skipped: cases that did not run here, e.g. the CUDA suite on a machine without a GPU).
#   bash scripts/doctest-totals.sh build/meson-logs/testlog.txt
set -euo pipefail
exec python3 - "$1" <<'PY'
import re, sys
passed = failed = skipped = 0
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped", line)
    if m:
        passed += int(m.group(2)); failed += int(m.group(3)); skipped += int(m.group(4))
print(f"doctest: {passed} passed, {failed} failed, {skipped} skipped")
PY
