"""The gated MLP activation's space: swiglu.py."""
