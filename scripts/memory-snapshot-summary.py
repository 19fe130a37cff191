#!/usr/bin/env python3
"""Summarises a memory_viz snapshot (recompose::dump_memory_snapshot, gpt --ledger's
OUT/memory-snapshot.pickle) as text: per category (CPU snapshots) or per user metadata's first
word (CUDA snapshots), the allocations and their bytes; the bytes alive at the dump and the
trace's peak, computed as memory_viz's "Active Memory Timeline" stacks them. Needs Python's
pickle only (no torch).

    python3 scripts/memory-snapshot-summary.py OUT/memory-snapshot.pickle
"""
import collections
import pickle
import sys


def main(path):
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    print(f"{path}: {len(snapshot['segments'])} segments at the dump")
    for device, trace in enumerate(snapshot["device_traces"]):
        # Allocated blocks alive at the dump: the level the trace ends at.
        live = sum(b["size"] for s in snapshot["segments"] if s["device"] == device
                   for b in s["blocks"] if b["state"] == "active_allocated")
        counts = collections.Counter()
        sizes = collections.Counter()
        level = most = 0
        for e in trace:
            if e["action"] == "alloc":
                key = e.get("category") or (e.get("user_metadata") or "").split(":")[0] or "none"
                counts[key] += 1
                sizes[key] += e["size"]
                level += e["size"]
            elif e["action"] == "free_completed":
                level -= e["size"]
            most = max(most, level)
        peak = live - level + most
        print(f"device {device}: {len(trace)} trace entries, {live} B allocated at the dump, "
              f"peak {peak} B")
        for key, n in sorted(counts.items(), key=lambda kv: -sizes[kv[0]]):
            print(f"  {key:<20} {n:>6} allocations {sizes[key]:>12} B")
        examples = {}
        for e in trace:
            text = e.get("user_metadata") or ""
            first = text.split(":")[0]
            if text and e["action"] == "alloc" and first not in examples:
                examples[first] = text
        for first, text in examples.items():
            print(f"  e.g. {text}")


if __name__ == "__main__":
    main(sys.argv[1])
