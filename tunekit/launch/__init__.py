"""Watching one call's kernel launches (`watch`) and replaying them (`plan`): the eager hot path's plans
(tunekit/runtime/hotpath.py) and what the tuner times a candidate through (tunekit/tuning/verify.py). Above core
and the kernels, below the store: it needs only core (the backend and the Triton adapter) and torch."""
