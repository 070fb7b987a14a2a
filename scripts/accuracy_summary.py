#!/usr/bin/env python3
"""Prints a `sieve eval --result-json` record's summary compactly: a row per configuration, a
column per task (score %, or perplexity), and the run's seconds. For logs of long grids, whose
`sieve eval` table is as wide as the configurations are many.

  python3 scripts/accuracy_summary.py RECORD.json
"""
import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        record = json.load(f)
    tasks = []
    values = {}
    for cell in record["summary"]:
        if cell["task"] not in tasks:
            tasks.append(cell["task"])
        if "perplexity" in cell:
            text = f"{cell['perplexity']:.1f}"
        else:
            text = f"{100.0 * cell.get('score', 0.0):.1f}"
        values[(cell["config"], cell["task"])] = text
    print(f"{'configuration':<28}" + "".join(f"{t[:12]:>13}" for t in tasks) + "  seconds")
    for config in record["configs"]:
        label = config["label"]
        seconds = config.get("kv", {}).get("seconds")
        print(f"{label:<28}" + "".join(f"{values.get((label, t), '-'):>13}" for t in tasks) +
              (f"  {seconds:.1f}" if seconds is not None else ""))


if __name__ == "__main__":
    main()
