"""The XLA flags test processes compile with (tests/conftest.py says why and what it measured): checked, not timed."""

# The third: XLA splits each CPU module into 32 parts to compile them on parallel threads; with two test workers on
# two cores that only adds work. Measured here, one process compiling three tiny models' generate and forward:
# 6.8 -> 6.1 s of CPU (3.4 -> 2.9 s wall) with one part; SmolLM2's first 64-token decode 5.4 -> 4.8 s.
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                "--xla_cpu_parallel_codegen_split_count=1")
# XLA's own defaults for the same three options: a test that reads the compiled program itself (what a learner's
# process runs) passes them back to `.compile(compiler_options=...)`.
LEARNER_COMPILE = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True,
                   "xla_cpu_parallel_codegen_split_count": 32}
