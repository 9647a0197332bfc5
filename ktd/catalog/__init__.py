"""The model catalog (what ktd knows how to fetch and launch) and pulls (ktd's download
jobs). A room of its own: nothing in ``ktd/daemon`` or ``ktd/frontend`` is imported here
except through injected callables; see ``docs/catalog.md``."""
