"""A stand-in ``kt_kernel`` package for the simulated engine (see ``ktd/sim/shim/sglang``).

Only what ktd's probe reads: the version and the CPU variant that was
"loaded". No imports, no side effects.
"""

__version__ = "0.0.0-sim"
__cpu_variant__ = "sim"
