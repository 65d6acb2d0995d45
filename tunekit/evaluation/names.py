"""The names the benchmark's suite, results and tables share: implementations (the JSON's `impl`), the ratios
of tunekit to the copy and to the roofline, and how a row was timed."""

# Implementation names (the JSON's `impl`); families add their own baselines (cuBLASLt, torch F.gelu).
TUNEKIT = "tunekit"
HEURISTIC = "heuristic"
EAGER = "torch"
COMPILED = "torch.compile"
MAX_AUTOTUNE = "max-autotune"
COPY = "copy"  # a device-to-device copy of the row's bytes, timed like the row (memory-bound rows)
# tunekit's ratios to the copy of the same bytes and to the roofline (the same names as the suite's targets).
COPY_RATIO = "tunekit/copy"
BOUND_RATIO = "tunekit/bound"

# How a row was timed.
EVENTS = "cuda-events"
GRAPH = "cuda-graph"
WALL = "interpreter-wall-clock"
