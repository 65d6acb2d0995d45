"""Gated linear units: SwiGLU, silu(gate) * up, the gated MLP activation, fused in one pass (forward only: training
runs torch's formula).

- swiglu.py: the jit kernel, launch, torch's formula and the declaration;
- perf_model.py: its tile geometry for the performance model.

Space: search_spaces/glu/.
"""
