"""``python -m ktd.sim``: a faithful stand-in for an SGLang + kt-kernel server.

It is the engine of ``ktd up --demo`` and of the test suite, so it reproduces
what ktd depends on in a real SGLang: the launch flags, the start-up order
(load first, then bind, then warm up), one scheduler child that dies with its
parent, the endpoint shapes and error shapes, streaming with usage, client
disconnects, draining on SIGTERM, and the memory API ktd's sleep and wake use
(``ktd.sim.memory``). Environment knobs (``KTD_SIM_*``, see
``ktd.sim.knobs``) set its timings and inject faults.

Kept import-free: the scheduler child and ``import ktd.sim`` stay cheap.
"""
