"""Admission (pure): which waiting request goes next, which is turned away, and why.

Two machines, one rule book. The daemon's ``Gate`` (one per engine) admits acquire
leases and the frontends' claim requests, in one line ordered by arrival tickets
that count across engines, and holds back the requests that arrived after a swap
began (*yielding*). The frontend's ``Desk`` admits its own requests onto the
standing claims it holds, asks for a claim when it has none, and decides what a
recall, a request's end or a lost daemon means. Both are fed events and the clock
and answer with actions; ``ktd.daemon.pool.gate`` and ``ktd.frontend.broker`` carry them out.

The limits, with one meaning on both sides and in every situation, are ``ktd.core.limits``'s.

Why a line and not a free-for-all: requests are served in arrival order, and a
request that cannot be served now is answered as soon as anything decides its
fate (granted, refused, timed out); none is left waiting with nothing to wake it.

The gate is ``ktd.core.gate``, the desk ``ktd.core.desk`` (with the API keys' terms and
priorities); every name of the three is this module's too.
"""

# The two machines and their rule book, under the one name their users import.
from ktd.core.desk import *  # noqa: F403
from ktd.core.gate import *  # noqa: F403
from ktd.core.limits import *  # noqa: F403
