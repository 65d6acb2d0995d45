"""A second process after `tunekit tune --kernel layernorm`: tunekit.ops.layer_norm must be served from the cache.

Prints the error against fp32 torch per shape and which dispatch layer served each key (expect only 'cache').
"""

import torch
import torch.nn.functional as F

import tunekit.ops
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.runtime.dispatch import dispatcher

spec = get_spec("layernorm")
for p in spec.default_problems(fingerprint()):
    m, n = p["rows"], p["cols"]
    x = torch.randn(m, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    y = tunekit.ops.layer_norm(x, (n,), w, b)
    ref = F.layer_norm(x.float(), (n,), w.float(), b.float()).half()
    print(m, n, "max err", (y.float() - ref.float()).abs().max().item())
d = dispatcher("layernorm")
print("served by:", dict(d.counters), "memo hits:", d.memo_hits)
