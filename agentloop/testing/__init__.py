"""Test helpers that ship with the library: the tiny local model."""
