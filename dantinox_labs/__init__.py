"""DantinoX Labs, the application: the `dantinox` command and the data the labs ship with.

The libraries it composes stay independent of it and of each other's heavy parts: `dantinox` (the model,
JAX), `content` (concept entries), `widgets` (the labs' components) and `classroom` (answers, the hub
service). `dantinox_labs.shipped` says where the trained runs, the lab notebooks and the measurements the
labs read live, in a checkout and in an installed wheel alike; `dantinox_labs.cli` is the command line.
"""
