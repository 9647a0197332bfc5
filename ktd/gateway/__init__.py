"""Scale-out on SGLang's own gateway (``sglang-router``): ktd keeps the router's view true.

kt-kernel cannot span hosts, so ktd scales out by replicas: every host's ktd
registers its ready engines (or its frontend) with the router, which routes
across hosts. Three modules, one job each:

* ``plan``: pure decisions. What should be registered (from engine states) and
  what to do about the router's view (desired set vs. ``GET /workers`` → actions).
* ``client``: the HTTP I/O against one router's worker API (httpx on trio).
* ``sync``: the one trio task that owns the sync, plus the pool hooks
  (deregister *before* drain, status annotations).
"""
