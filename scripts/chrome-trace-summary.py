#!/usr/bin/env python3
"""Summarises a Chrome trace that carries recompose's step ledger (gpt --profile N --ledger's
OUT/profile-<policy>.json, or OUT/ledger-trace.json) as text: recompose's tracks (thread_name
metadata), its events by (ph, cat, name), the slices of its regions, and the held and device
memory counters' largest and last values beside ledger.json's totals when given. Needs Python's
json only (no torch).

    python3 scripts/chrome-trace-summary.py OUT/profile-selective.json [OUT/ledger.json]
"""
import collections
import json
import sys


def recompose_events(trace):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = e.get("args", {}).get("name", "")
            if name.startswith("recompose"):
                tracks[(e.get("pid"), e.get("tid"))] = name
    mine = [e for e in events if e.get("ph") != "M" and (
        (e.get("pid"), e.get("tid")) in tracks or str(e.get("name", "")).startswith("recompose"))]
    return events, tracks, mine


def main(path, ledger_path=None):
    with open(path) as f:
        trace = json.load(f)
    events, tracks, mine = recompose_events(trace)
    base = trace.get("baseTimeNanoseconds") if isinstance(trace, dict) else None
    print(f"{path}: {len(events)} events, baseTimeNanoseconds {base}")
    print("tracks (thread_name metadata) of recompose:")
    for (pid, tid), name in sorted(tracks.items(), key=lambda kv: str(kv[0])):
        print(f"  pid {pid} tid {tid}: {name}")
    print("recompose events by (ph, cat, name):")
    kinds = collections.Counter((e.get("ph"), e.get("cat"), e.get("name")) for e in mine)
    for key, n in sorted(kinds.items(), key=lambda kv: str(kv[0])):
        print(f"  {n:4d} {key}")
    print("slices of the regions (us):")
    for e in sorted((e for e in mine if e.get("ph") == "X" and e.get("cat") in ("forward", "rebuild")),
                    key=lambda e: e["ts"]):
        print(f"  {e['cat']:8s} {e['name']:32s} {e['ts']} .. {e['ts'] + e.get('dur', 0)}")
    held = [e for e in mine if e.get("ph") == "C" and "held for backward" in e.get("name", "")]
    memory = [e for e in mine if e.get("ph") == "C" and "device memory" in e.get("name", "")]
    held_max = max((max(e["args"].values()) for e in held), default=None)
    print(f"held counter: {len(held)} samples, max {held_max} bytes")
    if memory:
        in_use = max(e["args"].get("in use", 0) for e in memory)
        last_peak = [e["args"]["peak since reset"] for e in sorted(memory, key=lambda e: e["ts"])
                     if "peak since reset" in e["args"]][-1:]
        print(f"device memory counter: {len(memory)} samples, max in use {in_use}, "
              f"last peak since reset {last_peak[0] if last_peak else None}")
    if ledger_path:
        with open(ledger_path) as f:
            ledger = json.load(f)
        print(f"{ledger_path}: format {ledger.get('format')} version {ledger.get('version')}, "
              f"totals.bytes_held {ledger['totals']['bytes_held']}, "
              f"timeline.peak_bytes {ledger.get('timeline', {}).get('peak_bytes')}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
