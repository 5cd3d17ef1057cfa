"""Helpers shared by the tests (mostly the integration and end-to-end ones)."""
