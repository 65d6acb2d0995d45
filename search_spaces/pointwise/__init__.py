"""The elementwise chain's spaces: pointwise.py (forward) and pointwise_backward.py."""
