"""Capacity: MLPerf-style search for the highest arrival rate each engine sustains within its SLOs.

- `method`: the search itself (shapes, probes, the next rate from the last verdict, the bracket,
  results/capacity.csv), a pure function of the configuration and the probes' artifacts;
- `step`: one probe measured through the campaign (deploy and gate, then a run);
- `figure`: the capacity figure. See docs/capacity.md.
"""
