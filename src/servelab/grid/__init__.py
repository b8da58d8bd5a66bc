"""The experiment grid and its settings: what a configuration means, before any job runs.

- `config`: validation (the JSON schema `config.schema.yaml`, then cross-references) and grid
  expansion: conditions, deployments, runs, trace seeds, offered load;
- `settings`: the typed settings, one frozen dataclass per config section, built once from the
  validated config; their defaults are the only defaults those sections have;
- `identity`: measurement identity: which settings define a measurement and which only operate
  the campaign, and the sealed measurement's key. See docs/campaigns.md.
"""
