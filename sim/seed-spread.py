#!/usr/bin/env python3
"""The seed spread of the simulator's grid, and which of its comparisons every seed agrees on.

Usage: sim/seed-spread.py GRID.md [GRID.md ...]

Each GRID.md is the output of one `sim --scenarios ... --seed N` grid (the same grid with a
different seed each). Prints, as Markdown:

1. per cell (scenario, variant, clients): goodput ÷ capacity, retries per first attempt and
   success %, each as the median over the seeds and its range;
2. per scenario and client count: the recommended settings (`fork-recommended`) against the
   best of upstream's two best-practice configurations in the same seed (`upstream-best`,
   `upstream-best-no-retries`), as the range of the goodput ratio over the seeds, and whether
   every seed puts it on the same side of 1 (a lead or a loss no seed contradicts) or not
   (within the seeds' noise).
"""

import statistics
import sys

FIGURES = ["goodput ÷ cap", "retries/first", "success %"]
BASELINES = ["upstream-best", "upstream-best-no-retries"]
FORK = "fork-recommended"


def cells(path):
    """{(scenario, variant, clients): {figure: value}} of one grid's table rows."""
    header, out = None, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("| "):
                continue
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            if row[0] == "scenario":
                header = row
                continue
            if header is None or set(row[0]) <= {"-"}:
                continue
            values = dict(zip(header, row))
            key = (values["scenario"], values["variant"], int(values["clients"]))
            out[key] = {fig: float(values[fig]) for fig in FIGURES}
    if not out:
        sys.exit(f"{path}: no grid rows")
    return out


def spread(values, digits):
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"


def main(paths):
    grids = [cells(p) for p in paths]
    keys = list(grids[0])
    for p, g in zip(paths[1:], grids[1:]):
        if list(g) != keys:
            sys.exit(f"{p}: not the same grid as {paths[0]}")
    print(f"{len(grids)} seeds. Median [range] over them.\n")
    print("| scenario | variant | clients | goodput ÷ cap | retries/first | success % |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        cols = [spread([g[key][fig] for g in grids], d) for fig, d in zip(FIGURES, (3, 3, 2))]
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cols) + " |")
    print(
        f"\n`{FORK}`'s goodput ÷ the best upstream's in the same seed (of "
        + " and ".join(f"`{b}`" for b in BASELINES)
        + "), its range over the seeds, and whether every seed agrees on the side of 1.\n"
    )
    print("| scenario | clients | ratio [range] | every seed |")
    print("|---|---|---|---|")
    for scenario, variant, clients in keys:
        if variant != FORK:
            continue
        ratios = []
        for g in grids:
            best = max(g[(scenario, b, clients)]["goodput ÷ cap"] for b in BASELINES)
            ratios.append(g[(scenario, FORK, clients)]["goodput ÷ cap"] / best)
        if min(ratios) > 1:
            verdict = "ahead"
        elif max(ratios) < 1:
            verdict = "behind"
        else:
            verdict = "within the noise"
        print(f"| {scenario} | {clients} | {spread(ratios, 3)} | {verdict} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])
