"""Communication graphs and their per-link parameters (generators arrive with C-ColME)."""
