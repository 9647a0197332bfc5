"""ktd: the daemon that owns ktransformers engines.

Kept import-free on purpose: ktctl imports ``ktd.protocol`` and must start fast.
"""

__version__ = "0.1.0"
