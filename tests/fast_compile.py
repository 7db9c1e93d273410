"""The XLA flags test processes compile with (tests/conftest.py says why and what it measured): checked, not timed."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
