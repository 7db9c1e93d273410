"""The XLA flags test processes compile with (tests/conftest.py says why and what it measured): checked, not timed."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
# XLA's own defaults for the same two options: a test that reads the compiled program itself (what a learner's
# process runs) passes them back to `.compile(compiler_options=...)`.
LEARNER_COMPILE = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
