"""tunekit inside other people's models: `patching` swaps a model's layers for tunekit's ops (`tunekit.patch` /
`unpatch`), with `patching_kinds`, `patching_probes`, `patching_fusion`, `patching_rope` and `patching_loss`. Its
layer, with `tunekit.nn`, sits above the public ops it calls."""
