"""servelab.sim: simulated vLLM-0.6.3-V0-like and SGLang-0.4.1-like engines (the default backend).

Public entry points (docs/simulator.md):
- `servelab.sim.run.sim_deploy(...)`: resolve an engine's configuration, write its start-up log.
- `servelab.sim.run.simulate_run_files(...)`: simulate one run, write its artifacts.
- `servelab.sim.run.build_engine(...)`: a configured engine model for other drivers (real-time server).
Engine models: `sim.vllm.VllmModel`, `sim.sglang.SglangModel` (interface in `sim.base`).
Nothing is imported here, so importing a submodule stays cheap.
"""
