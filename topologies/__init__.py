"""Communication graphs: generators and loaders registered in `desim.registry.TOPOLOGIES`.

`topologies.graph.Graph` is the CSR form protocols use (built once per run, no networkx in the
hot loop); `topologies.generators` holds the models a study names in its [topology] table.
Importing this package registers them with desim.
"""

from topologies import generators  # noqa: F401  (registration side effects)
from topologies.graph import Graph, component_sizes

__all__ = ["Graph", "component_sizes"]
