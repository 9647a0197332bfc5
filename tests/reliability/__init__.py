"""Reliability suite (issue #6, daemon side): control-socket fuzzing, injected faults, and a
stateful model of the daemon checked against the live process table."""
