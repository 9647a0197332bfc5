"""The catalog's requests and the pulls' daemon side: names resolved against this box, and the
models.json entry a finished pull writes.
"""
