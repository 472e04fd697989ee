"""Communication graphs: generators and loaders registered in `desim.kernel.registry.TOPOLOGIES`.

`desim.topologies.graph.Graph` is the CSR form protocols use (built once per run, no networkx in the
hot loop); `desim.topologies.generators` holds the models a study names in its [topology] table.
Importing this package registers them with desim.
"""

from desim.topologies import files, generators  # noqa: F401  (registration side effects)
from desim.topologies.graph import Graph, component_sizes

__all__ = ["Graph", "component_sizes"]
