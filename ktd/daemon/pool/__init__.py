"""The engines together: placement, load admission, the pool's API and its control operations,
the state file and adoption, expiry and the usage ledger.
"""
