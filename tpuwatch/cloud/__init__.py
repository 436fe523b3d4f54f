"""Adapters over the Google Cloud client libraries (TPU, Logging, Storage)."""
