"""``GET /metrics`` in SGLang's Prometheus naming (``sglang:`` prefix, ``model_name`` label).

Why: ktd's frontend scrapes each ready engine's ``/metrics`` and republishes it
labelled by alias, so the sim must serve a small, realistic exposition. Like
SGLang it exists only with ``--enable-metrics`` (404 otherwise); values come
from the sim's own request accounting.
"""

from __future__ import annotations

from ktd.sim.state import TTFT_BUCKETS, ServerState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def render(model: str, state: ServerState) -> bytes:
    s = state.stats
    label = f'model_name="{model}"'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{label}}} {s.active}.0",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{label}}} 0.0",
        "# HELP sglang:token_usage The token usage.",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{{{label}}} 0.0",
        "# HELP sglang:num_requests_total Number of requests processed.",
        "# TYPE sglang:num_requests_total counter",
        f"sglang:num_requests_total{{{label}}} {s.completed + s.aborted}.0",
        "# HELP sglang:num_aborted_requests_total Number of requests aborted.",
        "# TYPE sglang:num_aborted_requests_total counter",
        f"sglang:num_aborted_requests_total{{{label}}} {s.aborted}.0",
        "# HELP sglang:e2e_request_latency_seconds Histogram of end-to-end request latency.",
        "# TYPE sglang:e2e_request_latency_seconds histogram",
    ]
    done = s.completed + s.aborted
    for b in _BUCKETS:
        lines.append(f'sglang:e2e_request_latency_seconds_bucket{{le="{b}",{label}}} {done}.0')
    lines.append(f'sglang:e2e_request_latency_seconds_bucket{{le="+Inf",{label}}} {done}.0')
    lines.append(f"sglang:e2e_request_latency_seconds_sum{{{label}}} 0.0")
    lines.append(f"sglang:e2e_request_latency_seconds_count{{{label}}} {done}.0")
    lines += [
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{{{label}}} {s.prompt_tokens}.0",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{{{label}}} {s.generation_tokens}.0",
        "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE sglang:time_to_first_token_seconds histogram",
    ]
    for bound, count in zip(TTFT_BUCKETS, s.ttft_counts, strict=True):
        lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="{bound}",{label}}} {count}.0')
    lines += [
        f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",{label}}} {s.ttft_count}.0',
        f"sglang:time_to_first_token_seconds_sum{{{label}}} {s.ttft_sum}",
        f"sglang:time_to_first_token_seconds_count{{{label}}} {s.ttft_count}.0",
    ]
    return ("\n".join(lines) + "\n").encode()
