"""Helpers for the hardening tests: the kill-and-restart harness (harness.py)."""
