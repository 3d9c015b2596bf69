"""Inference engines behind one token-in/token-out protocol."""
