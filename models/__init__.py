"""What desim simulates: data models, privacy mechanisms, protocol families and closed forms.

Installed as `desim.models`. One sub-package per protocol family — `colme` (Private-ColME),
`ccolme` (C-ColME and Private-C-ColME on graphs), `pricer` (PriCER and ColRel), `eb`
(empirical-Bayes personalised estimation through a server) — with what the
families share beside them: the class data model (`data`), the local and ideal baselines
(`baselines`), DP calibration and the p-sum releases (`privacy`) and metrics (`metrics`).
Importing this package registers its protocols, data models, metrics and curves with desim.
"""

from desim.models import baselines, ccolme, colme, data, eb, metrics, pricer, table  # noqa: F401  (registration side effects)
