"""The configuration through the daemon: the desk (plan, apply, rollback), its history and the
files.
"""
