"""The campaign: what every backend shares between the grid and the run artifacts.

- `deploy`: render a deployment's manifests, bring its engine up, and gate its start-up log
  (the only gate);
- `blocks`: measure a block (every repetition of one arm, engine and condition) with retries,
  keep failed attempts, discard and repeat on reclamation, resume, seal, never overwrite;
- `restart`: the restart experiment (Figure 14);
- `plan`, `status`, `redo`: a campaign's GPU-hours before, its runs' states during and after, and
  the deliberate re-measurement of chosen runs; `cli`: `servelab campaign plan|status|redo`.
"""
