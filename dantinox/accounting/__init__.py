"""Accounting: what a cache and a model cost. memory.py (bytes, device presets, the largest batch),
kv_ledger.py (a published model's cache per layer), working_model.py (a model with that per-layer cache
geometry that decodes, measured from its arrays), peer_allocation.py (what vLLM and llama.cpp allocate),
roofline.py (a step's bytes and time against the machine) and profile.py (where a step's time goes)."""
