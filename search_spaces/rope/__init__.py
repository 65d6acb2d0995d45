"""Rotary embedding's space (rope.py), forward and backward."""
