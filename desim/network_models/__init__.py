"""Network models: what links and nodes do in a what-if study.

Fixed delays and the Bernoulli links of PriCER (`links`), delay distributions
(`distributions`), per-message latency (`latency`), link and node availability — Bernoulli,
Markov (Gilbert–Elliott), traces and churn (`availability`) —, stragglers (`stragglers`), and
their composition into one link model from a study's ``[network]`` table (`realistic`).
Importing the package registers them.
"""

from desim.network_models import (  # noqa: F401  (registration side effects)
    availability,
    distributions,
    latency,
    links,
    realistic,
    stragglers,
)
