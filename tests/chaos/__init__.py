"""Helpers for the hardening tests (issue 9): the kill-and-restart harness (harness.py)."""
