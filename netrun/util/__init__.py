"""Helpers every layer may use: atomic file writes and reading text files with clear errors."""
