"""Incident reports rendered from a case."""
