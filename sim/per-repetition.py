#!/usr/bin/env python3
"""Lab and model, repetition by repetition, against the host each lab run measured.

Usage: sim/per-repetition.py LAB_SCENARIO_DIR SIM_SERIES_CSV VARIANT [LAB_SCENARIO_DIR SIM_SERIES_CSV ...]

LAB_SCENARIO_DIR is one scenario of a lab suite run (its `summary.json`), SIM_SERIES_CSV the
`--series` file of `sim --lab-verdict` on that suite (the simulations on each run's host). For
each valid repetition of VARIANT it prints the requests completed in time (the lab's `good`, the
simulations' summed `success`, median over the replications), the run's mean core hand-off
(`requestHandoffMs + otherHandoffMs` over their counts) and the model's share of the lab, then a
least-squares line of each against the hand-off. Pairs a repetition with its simulations by seed:
the first replication of repetition r carries the lab's seed for r (`seed + 1000 r`), the others
follow it in the file.
"""
import csv
import json
import statistics
import sys
from collections import OrderedDict


def repetitions(lab_dir, series_path, variant):
    summary = json.load(open(f"{lab_dir}/summary.json"))
    scenario = summary["config"]["scenario"]["name"]
    base_seed = summary["config"]["seed"]
    runs = [r for r in summary["runs"] if r["variant"] == variant and not r["invalid"]]
    # Successes per simulation, in file order.
    sims = OrderedDict()
    for row in csv.DictReader(open(series_path)):
        if row["scenario"] == scenario and row["variant"] == variant:
            sims[row["seed"]] = sims.get(row["seed"], 0) + int(row["success"])
    seeds = list(sims)
    out = []
    for run in runs:
        first = str(base_seed + 1000 * run["rep"])
        if first not in sims:
            sys.exit(f"{series_path}: no simulation of {variant} repetition {run['rep']} (seed {first})")
        i = seeds.index(first)
        group = [seeds[i]]
        for s in seeds[i + 1:]:
            # A replication's seed is never a repetition's.
            if any(str(base_seed + 1000 * r["rep"]) == s for r in runs):
                break
            group.append(s)
        server = run["server"]
        handoffs = server["requestHandoffs"] + server["otherHandoffs"]
        handoff_ms = (server["requestHandoffMs"] + server["otherHandoffMs"]) / handoffs
        model = statistics.median(sims[s] for s in group)
        out.append((handoff_ms, run["good"], model, len(group)))
    return out


def line(xs, ys):
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main(args):
    if len(args) < 3 or len(args) % 2 == 0:
        sys.exit(__doc__)
    variant = args[2]
    pairs = [(args[0], args[1])] + [(args[i], args[i + 1]) for i in range(3, len(args), 2)]
    everything = []
    for lab_dir, series in pairs:
        reps = repetitions(lab_dir, series, variant)
        everything += reps
        print(f"\n{lab_dir} ({variant}, {len(reps)} repetitions)\n")
        print("| hand-off (ms) | lab in time | model in time | model ÷ lab |")
        print("|---|---|---|---|")
        for h, lab, model, k in sorted(reps):
            print(f"| {h:.4f} | {lab} | {model:.1f} | {model / lab:.3f} |")
        summarize(reps)
    if len(pairs) > 1:
        print("\nAll runs together:")
        summarize(everything)


def summarize(reps):
    xs = [r[0] for r in reps]
    lab = line(xs, [r[1] for r in reps])
    model = line(xs, [r[2] for r in reps])
    ratio = line(xs, [r[2] / r[1] for r in reps])
    print(
        f"\nmedian hand-off {statistics.median(xs):.4f} ms; in time against the hand-off: "
        f"lab {lab[0]:.0f} {lab[1]:+.0f} per ms, model {model[0]:.0f} {model[1]:+.0f} per ms; "
        f"model ÷ lab {ratio[0]:.3f} {ratio[1]:+.2f} per ms "
        f"({ratio[0] + ratio[1] * 0.035:.3f} at 0.035 ms, {ratio[0] + ratio[1] * 0.05:.3f} at 0.05 ms)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
