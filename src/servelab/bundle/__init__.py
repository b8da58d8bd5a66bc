"""The campaign bundle for artifact evaluation (docs/artifact.md).

- `archive`: writes one deterministic archive of a results folder and verifies one anywhere,
  regenerating every analysis output from its run artifacts alone;
- `cli`: `servelab bundle` and `servelab verify`.
"""
