"""Declarations every part reads: kernel specs and spaces, devices, the registry, errors, settings, identity."""
