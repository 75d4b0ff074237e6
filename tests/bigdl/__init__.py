"""Test helpers for the bigdl engine (they import in both the main venv and .venv-bigdl)."""
