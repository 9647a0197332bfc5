"""``ktd.core.gpuexperts``: what SGLang's out-of-memory lines are, a catalog entry's derived
count, and the machine: one retry with fewer per load, only for a derived count, the
count that loaded kept (and used) until the derived count changes."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ktd.core import gpuexperts as G
from tests.hypo import budget

#: What SGLang prints (its scheduler's "Scheduler hit an exception: <traceback>", torch's
#: allocator; sglang/srt/model_executor/model_runner_kv_cache_mixin.py's KV-cache words).
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
    "total capacity of 23.55 GiB of which 1.02 GiB is free."
)
KV_OOM = (
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: self.server_args.mem_fraction_static=0.88"
)


def test_out_of_memory_is_what_sglang_and_torch_print() -> None:
    assert G.out_of_memory(["Load weight begin.", f"[2026-01-01 TP0] {TORCH_OOM}"])
    assert G.out_of_memory([KV_OOM])
    assert G.out_of_memory(["RuntimeError: CUDA error: out of memory"])
    assert not G.out_of_memory(["ValueError: unrecognized arguments: --kt-foo", ""])


def test_the_derived_count_is_a_catalog_entrys_flag() -> None:
    args = ("--kt-method", "AMXINT4", "--kt-num-gpu-experts", "40")
    assert G.derived_count("deepseek-v4-kt", args) == 40
    assert G.derived_count("", args) is None  # written by hand: the user's count
    assert G.derived_count("x", ("--kt-num-gpu-experts=12",)) == 12
    assert G.derived_count("x", ("--kt-num-gpu-experts", "many")) is None
    assert G.derived_count("x", ("--kt-method", "AMXINT4")) is None
    assert G.with_count(args, 30) == ("--kt-method", "AMXINT4", "--kt-num-gpu-experts", "30")
    assert G.with_count(("--kt-num-gpu-experts=12",), 9) == ("--kt-num-gpu-experts=9",)


def test_fewer_takes_a_quarter_and_at_least_one() -> None:
    assert [G.fewer(n) for n in (40, 8, 3, 1, 0)] == [30, 6, 2, 0, 0]


def test_an_out_of_memory_load_retries_once_with_fewer_and_keeps_what_loaded() -> None:
    m = G.ExpertsMachine()
    assert m.launch("k2", 40) == 40
    retry = m.failed("k2", 40, oom=True)
    assert retry == G.Retry(used=40, count=30)
    assert "retrying once with 30" in retry.reason()
    assert m.launch("k2", 40) == 30
    assert m.ready("k2", 40) == G.Kept(derived=40, count=30)
    assert m.launch("k2", 40) == 30 and m.kept("k2", 40) == 30
    # Another derived count (the entry written again): the kept one is not for it.
    assert m.launch("k2", 36) == 36 and m.kept("k2", 36) is None


def test_a_retry_that_fails_again_ends_the_load() -> None:
    m = G.ExpertsMachine()
    assert isinstance(m.failed("k2", 40, oom=True), G.Retry)
    assert m.failed("k2", 40, oom=True) == G.Ended()
    assert m.launch("k2", 40) == 40  # the next load starts from the derived count again
    assert isinstance(m.failed("k2", 40, oom=True), G.Retry)


def test_no_retry_without_oom_or_without_a_derived_count() -> None:
    m = G.ExpertsMachine()
    assert m.failed("a", 40, oom=False) == G.Ended()
    assert m.failed("a", None, oom=True) == G.Ended()
    assert m.failed("a", 0, oom=True) == G.Ended()  # nothing left to take off
    assert m.ready("a", 40) is None  # loaded as written: nothing to keep


def test_restored_counts_are_used_only_for_their_derived_count() -> None:
    m = G.ExpertsMachine()
    m.restore("k2", 40, 30)
    m.restore("bad", 10, 12)  # more than derived: never kept
    assert m.launch("k2", 40) == 30 and m.launch("bad", 10) == 10


class ExpertsRules(RuleBasedStateMachine):
    """Loads of one model, each ending failed (out of memory or not), ready or otherwise,
    with the entry sometimes written again with another derived count."""

    def __init__(self) -> None:
        super().__init__()
        self.m = G.ExpertsMachine()
        self.derived: int | None = 40
        self.retries_this_load = 0
        self.launched: int | None = None
        # The model's: the count that loaded after a retry, with the derived count it cut
        # (kept for that derived count; another one launches as written).
        self.kept_for: tuple[int, int] | None = None
        self.retry_for: int | None = None  # the derived count the retry under way cut

    @rule()
    def launch(self) -> None:
        self.launched = self.m.launch("m", self.derived)
        if self.derived is None:
            assert self.launched is None
        else:
            assert self.launched is not None and 0 <= self.launched <= self.derived
            if self.retries_this_load and self.retry_for == self.derived:
                assert self.launched < self.derived  # the retry's count
            elif self.kept is not None:
                assert self.launched == self.kept

    @precondition(lambda self: self.launched is not None or self.derived is None)
    @rule(oom=st.booleans())
    def failed(self, oom: bool) -> None:
        used = self.m.launch("m", self.derived)
        got = self.m.failed("m", self.derived, oom)
        if isinstance(got, G.Retry):
            assert oom and self.derived is not None and self.retries_this_load == 0
            assert got.used == used and got.count < got.used
            self.retries_this_load, self.retry_for = 1, self.derived
        else:
            self.retries_this_load = 0
            self.launched = None

    @rule()
    def ready(self) -> None:
        before = self.m.trying("m")
        got = self.m.ready("m", self.derived)
        if got is not None:  # a retry's count loaded: kept, below the derived count
            assert before == got.count and self.derived is not None
            assert got.count < self.derived and self.retry_for == self.derived
            self.kept_for = (self.derived, got.count)
        else:  # loaded as written, or the entry was written again under the retry
            assert before is None or self.derived != self.retry_for
        self.retries_this_load = 0

    @rule()
    def ended(self) -> None:
        self.m.ended("m")
        self.retries_this_load = 0

    @property
    def kept(self) -> int | None:
        """What the machine must keep for the derived count as it is now."""
        if self.kept_for is None or self.kept_for[0] != self.derived:
            return None
        return self.kept_for[1]

    @rule(derived=st.one_of(st.none(), st.integers(0, 64)))
    def rewritten(self, derived: int | None) -> None:
        self.derived = derived  # a kept count belongs to the derived count it replaced

    @invariant()
    def at_most_one_retry_a_load(self) -> None:
        assert self.retries_this_load in (0, 1)
        assert (self.m.trying("m") is not None) == bool(self.retries_this_load)

    @invariant()
    def the_kept_count_is_below_the_derived_one(self) -> None:
        got = self.m.kept("m", self.derived)
        assert got == self.kept or (got is None and self.kept is None)


TestExperts = ExpertsRules.TestCase
TestExperts.settings = budget(300, stateful_step_count=40, deadline=None)
