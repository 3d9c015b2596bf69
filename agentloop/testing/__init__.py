"""Test helpers (no library module imports them): an example agent program, tiny variants."""
