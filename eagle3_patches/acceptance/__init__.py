"""Measuring a draft's expected accept length offline."""
