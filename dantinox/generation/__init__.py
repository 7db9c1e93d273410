"""Generation: the decode loop (generate.py: generate, stream, the compiled step), n samples of one prompt
sharing its pages (forking.py), quality measures of a cache setting against the full cache (quality.py), block
diffusion decoding (diffusion.py) and the sharding of a decode over a device mesh (sharding.py)."""
