"""Model definitions of bench/model_set.py's benchmark sets."""
