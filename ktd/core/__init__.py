"""The pure core: decisions as functions of values, with no trio, socket or process.

The daemon (``Engine``, ``Pool``) carries these decisions out; a change of policy
is tested here without starting anything.
"""
