"""Turn the MIT Election Data + Science Lab county presidential returns into the six held-out
folds this study reads (see README.md).

    python prepare.py countypres_2000-2020.csv

reads the downloaded file (columns year, county_fips, party, candidatevotes, mode, …; other
columns are ignored) and writes folds/test-YEAR.csv for each election YEAR of 2000–2020: one
row per county and training election (agent = the 5-digit FIPS code, order = the year, value =
1 if the Republican candidate had the most votes in the county, else 0) and, per county, the
held-out YEAR's outcome as its truth. Counties without a result in every one of the six
elections are left out (the number is printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

#: The elections of the paper's experiment.
YEARS = (2000, 2004, 2008, 2012, 2016, 2020)
#: The columns read from the downloaded file.
COLUMNS = ("year", "county_fips", "party", "candidatevotes", "mode")


def outcomes(returns: pd.DataFrame) -> pd.DataFrame:
    """One row per county and election (agent, order, value): value 1 when the Republican
    candidate had the most votes. Where a county reports its votes by mode (2020) and also a
    TOTAL row, the TOTAL row is used; otherwise the modes are added up."""
    missing = [c for c in COLUMNS if c not in returns.columns]
    if missing:
        raise SystemExit(f"the file has no column {missing[0]!r}; expected {', '.join(COLUMNS)}")
    r = returns[returns["year"].isin(YEARS) & returns["county_fips"].notna()].copy()
    r["agent"] = r["county_fips"].astype(float).astype(int).map("{:05d}".format)
    r["mode"] = r["mode"].fillna("TOTAL").str.upper()
    has_total = r.groupby(["year", "agent"])["mode"].transform(lambda m: (m == "TOTAL").any())
    r = r[~has_total | (r["mode"] == "TOTAL")]
    votes = r.groupby(["year", "agent", "party"])["candidatevotes"].sum().unstack("party")
    votes = votes.fillna(0.0)
    if "REPUBLICAN" not in votes.columns:
        raise SystemExit("no party 'REPUBLICAN' in the file's party column")
    others = votes.drop(columns="REPUBLICAN").max(axis=1)
    won = (votes["REPUBLICAN"] > others).astype(int).rename("value").reset_index()
    return won.rename(columns={"year": "order"})[["agent", "order", "value"]]


def folds(won: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """For each held-out year, the training rows of every county present in all six
    elections with the held-out outcome as its truth column."""
    counts = won.groupby("agent")["order"].nunique()
    full = won[won["agent"].isin(counts.index[counts == len(YEARS)])]
    out = {}
    for year in YEARS:
        truth = full[full["order"] == year].set_index("agent")["value"]
        train = full[full["order"] != year].copy()
        train["truth"] = train["agent"].map(truth)
        out[year] = train.sort_values(["agent", "order"]).reset_index(drop=True)
    return out


def main(argv: list[str]) -> int:
    """Read the downloaded file named in `argv` and write the folds beside this script."""
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python prepare.py countypres_2000-2020.csv", file=sys.stderr)
        return 2
    won = outcomes(pd.read_csv(argv[0], usecols=lambda c: c in COLUMNS, low_memory=False))
    target = Path(__file__).resolve().parent / "folds"
    target.mkdir(exist_ok=True)
    split = folds(won)
    for year, table in split.items():
        table.to_csv(target / f"test-{year}.csv", index=False)
    m = split[YEARS[0]]["agent"].nunique()
    dropped = won["agent"].nunique() - m
    print(f"{m} counties in all six elections ({dropped} left out); folds in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
