"""Stand-ins for an engine's native kernels that no registry carries for the CPU (docs/engines.md,
"SGLang 0.5 on the CPU"). Each is installed into that engine's own environment, never imported by
servelab itself: `sgl_kernel` (tools/build-sglang-cpu.sh copies it into SGLang's venv)."""
