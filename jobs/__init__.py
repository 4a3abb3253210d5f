"""Runnable jobs a scheduler launches: thin doors over cropi.pipeline."""
