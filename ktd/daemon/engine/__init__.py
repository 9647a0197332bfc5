"""One engine: the lifecycle machine's driver, the launch, the probe, the memory calls, health,
the engine's log and its process tree.
"""
