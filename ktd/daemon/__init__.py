"""The daemon: trio tasks and processes (the entry, the control server, the pool,
one supervisor per engine, process trees, health probes, adoption and the state file)."""
