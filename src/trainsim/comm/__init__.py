"""Communication costs: alpha-beta collectives over the two-level topology."""
