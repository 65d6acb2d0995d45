"""The reductions' space (reduction.py): inner and outer kernels, block sizes, splits."""
