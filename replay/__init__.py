"""The reference engine of the prefill/decode page handoff (replay of logged requests)."""
