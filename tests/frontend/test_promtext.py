"""Prometheus text merged (``ktd.frontend.promtext``): engines labelled by alias."""

from __future__ import annotations

from ktd.frontend.promtext import label_sample, merge


def test_metrics_merge_labels_by_alias_and_keeps_one_header_per_family() -> None:
    text = (
        "# HELP sglang:num_running_reqs Running.\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="x"} 2.0\n'
        "# TYPE sglang:lat histogram\n"
        'sglang:lat_bucket{le="1"} 1\nsglang:lat_count 1\n'
    )
    out = merge([("a", text), ("b", text)])
    assert out.count("# TYPE sglang:num_running_reqs gauge") == 1
    assert 'sglang:num_running_reqs{alias="a",model_name="x"} 2.0' in out
    assert 'sglang:num_running_reqs{alias="b",model_name="x"} 2.0' in out
    assert 'sglang:lat_count{alias="b"} 1' in out
    lines = out.splitlines()
    assert lines.index('sglang:lat_count{alias="a"} 1') > lines.index("# TYPE sglang:lat histogram")
    assert label_sample('x{alias="own"} 1', "a") == 'x{alias="own"} 1'
    assert label_sample("x{} 1", 'q"') == 'x{alias="q\\""} 1'
    assert merge([]) == ""
