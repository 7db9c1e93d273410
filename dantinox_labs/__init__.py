"""DantinoX Labs, the application: the `dantinox` command and the data the labs ship with.

The libraries it composes do not import it (widgets read only `shipped`, to find the data) and keep out of
each other's heavy parts: `dantinox` (the model, JAX), `content` (concept entries), `widgets` (the labs'
components) and `classroom` (answers, the hub service); tests/test_architecture.py checks the rule.
`dantinox_labs.shipped` says where the trained runs, the lab notebooks and the measurements the
labs read live, in a checkout and in an installed wheel alike; `dantinox_labs.workspace` keeps the learner's
own copy of the labs; `dantinox_labs.cli` is the command line.
"""
