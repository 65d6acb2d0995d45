"""Search spaces, installed as tunekit.search_spaces: one package per kernel family, mirroring kernels/, one module
per kernel (parameters, values, rules as pure predicates); rows.py holds what the row kernels' spaces share,
common.py the rules several families' spaces share."""
