"""Offline HF processors for tests, benchmarks and the demo (no model hub, ever)."""
