"""Architectures and their loaders: the config (config.py: the per-layer spec and the cache config, with
config_upgrade.py for older run directories and windows.py for layer patterns), the model (model.py,
attention.py), the catalogue of published models (catalogue.py) and the loaders of real weights and
tokenizers (pretrained.py, gguf_header.py, bpe.py, tokenizer.py)."""
