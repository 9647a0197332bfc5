"""``ktctl load --dry-run`` and ``--estimate`` as text (``ktctl/planview.py``, issue 43):
every value in words, a missing SGLang said as such, and GPU memory on a machine with
no GPU as "does not fit"."""

from __future__ import annotations

from typing import Any

from ktctl import planview

GIB = 1 << 30

#: What ktd 43's daemon answered for a model whose Python had no SGLang, on a box with no
#: GPU (the issue's report), before the fix: ``sglang`` null, a note with "(None)", an
#: ``impossible: false``, and a GPU need the verdict did not look at.
BEFORE: dict[str, Any] = {
    "alias": "m", "ok": True, "numa_nodes": [], "cpus": [], "gpus": [], "evict": [],
    "blocked_by": [], "reason": None, "impossible": False, "flags": [],
    "notes": ["SGLang's options could not be read (None): argv not checked against them"],
    "argv": ["/usr/bin/python3", "-m", "sglang.launch_server", "--model", "/m"],
    "env": {}, "state": "stopped", "running_pid": None, "python": "/usr/bin/python3",
    "sglang": None,
    "estimate": {"host_bytes": 0, "gpu_bytes": int(38.3 * GIB), "gpu_weights_bytes": 29 * GIB,
                 "kv_cache_bytes": int(9.3 * GIB), "ctx": 163840, "notes": []},
    "fit": {"ok": True, "reason": None, "rows": [], "notes": [], "policy": "check"},
}  # fmt: skip


def test_a_missing_sglang_is_said_and_no_raw_value_is_shown() -> None:
    text = planview.plan_text("m", BEFORE)  # the daemon's "(None)" note is fixed there
    assert "null" not in text and "impossible" not in text
    assert "  sglang:      MISSING: not found in /usr/bin/python3" in text
    after = {
        **BEFORE,
        "notes": [],
        "sglang_error": "no SGLang in /usr/bin/python3 (ModuleNotFoundError: No module named "
        "'sglang'): a load would fail; install sglang-kt in that Python, or set kt.python to "
        "one that has it",
    }
    text = planview.plan_text("m", after)
    assert "  sglang:      MISSING: no SGLang in /usr/bin/python3 (ModuleNotFoundError" in text
    ok = {**BEFORE, "sglang": "sglang-kt 0.7.2", "notes": []}
    assert "  sglang:      sglang-kt 0.7.2 (/usr/bin/python3)" in planview.plan_text("m", ok)


def test_unknown_keys_are_said_in_words() -> None:
    plan = {**BEFORE, "sglang": "sglang 0.5", "extra": {"k": 1}, "warm": True, "gone": None,
            "tags": ["a", "b"]}  # fmt: skip
    text = planview.plan_text("m", plan)
    assert 'extra: {"k": 1}' in text and "warm: yes" in text and "tags: a, b" in text
    assert "gone" not in text


def test_an_impossible_plan_says_never() -> None:
    plan = {**BEFORE, "ok": False, "impossible": True, "reason": "numa: unknown NUMA node 7"}
    text = planview.plan_text("m", plan)
    assert "  BLOCKED (never on this machine): numa: unknown NUMA node 7" in text


def test_no_gpu_is_does_not_fit_and_says_a_load_goes_ahead() -> None:
    fit = {
        "ok": False, "no_gpu": True, "refuses": False, "policy": "check", "notes": [],
        "reason": "does not fit: no GPU: it needs 38.3 GiB of GPU memory (weights + KV cache) "
        "and ktd sees no GPU on this machine",
        "rows": [{"what": "host RAM", "need": 0, "free": 23 * GIB},
                 {"what": "GPU memory", "need": int(38.3 * GIB), "free": 0}],
    }  # fmt: skip
    lines = planview.estimate_lines({**BEFORE, "fit": fit})
    text = "\n".join(lines)
    assert "fits" not in lines[-1] and "    fits" not in lines
    assert "DOES NOT FIT: does not fit: no GPU: it needs 38.3 GiB of GPU memory" in text
    assert "GPU memory            needs 38.3 GiB, free no GPU" in text
    assert "a load is not refused for this alone" in text


def test_a_config_plan_says_a_list_is_replaced_and_what_it_drops() -> None:
    from ktctl import configview
    from ktd import protocol as p

    old = ["--kt-method", "AMXINT4", "--kt-num-gpu-experts", "8", "--enable-metrics"]
    replaced = p.FieldChange(field="kt.extra_args", old=old, new=["--foo"])
    assert configview.field_text(replaced).endswith(
        "(drops --kt-method AMXINT4 --kt-num-gpu-experts 8 --enable-metrics; adds --foo)"
    )
    assert configview.field_text(replaced).startswith('kt.extra_args replaced: ["--kt-method"')
    appended = p.FieldChange(field="kt.extra_args", old=old, new=[*old, "--foo"])
    assert "replaced" not in configview.field_text(appended)
    env = p.FieldChange(field="kt.extra_env", old={"A": "1", "B": "2"}, new={"C": "3"})
    assert configview.field_text(env).endswith("(drops A, B)")
    assert configview.field_text(p.FieldChange(field="ttl", old=0, new=5)) == "ttl 0 -> 5"


def test_a_plan_says_who_is_put_to_sleep_rather_than_evicted() -> None:
    text = planview.plan_text("m", {**BEFORE, "evict": ["a", "b"], "sleeps": ["a"]})
    assert "  would evict: b\n  would put to sleep: a" in text
    text = planview.plan_text("m", {**BEFORE, "evict": ["a"], "sleeps": ["a"]})
    assert "would evict" not in text and "  would put to sleep: a" in text
    assert "  would evict: nothing" in planview.plan_text("m", BEFORE)
