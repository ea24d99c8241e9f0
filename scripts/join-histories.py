#!/usr/bin/env python3
"""Joins the client histories (Elle JSON lines, `--history`) of runs of one cluster, the
first ones ended by a crash, into one history that a checker such as adya can judge as a
whole: were the transactions acknowledged before the crash all there afterwards, and none
applied twice?

- An operation a crash left open (invoked, never completed) is completed as `info` (outcome
  unknown) where its history ends: it may or may not have committed.
- Each later history's processes are renumbered after the earlier ones' (a process whose
  last operation is `info` never invokes again, as Elle requires).
- Events are renumbered in file order, which is real-time order (each file is written in
  real-time order, and each run started after the previous one ended).

usage: scripts/join-histories.py FIRST.jsonl [LATER.jsonl ...] > JOINED.jsonl
"""
import json
import sys


def main(paths):
    index = 0
    offset = 0
    out = sys.stdout
    for path in paths:
        open_ops = {}
        top = -1
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    # A crash may cut the last line short; nothing can follow it.
                    print(f"{path}:{n}: skipping a line cut short", file=sys.stderr)
                    continue
                p = e["process"]
                top = max(top, p)
                if e["type"] == "invoke":
                    open_ops[p] = e["value"]
                else:
                    open_ops.pop(p, None)
                e["process"] = p + offset
                e["index"] = index
                index += 1
                out.write(json.dumps(e) + "\n")
        for p, value in sorted(open_ops.items()):
            e = {"index": index, "type": "info", "process": p + offset, "value": value}
            index += 1
            out.write(json.dumps(e) + "\n")
        offset += top + 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
