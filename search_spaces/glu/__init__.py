"""The gated linear units' spaces: swiglu.py (SwiGLU)."""
