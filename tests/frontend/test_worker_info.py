"""What sglang-router reads of a worker (``ktd.frontend.worker_info``), in SGLang's shapes."""

from __future__ import annotations

from ktd.frontend.worker_info import model_info_shape, server_info_shape, sum_loads


def test_worker_info_shapes_are_sglangs() -> None:
    mi = model_info_shape("/models/x")
    assert set(mi) >= {
        "model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
        "weight_version", "has_image_understanding", "has_audio_understanding",
        "model_type", "architectures",
    }  # fmt: skip
    si = server_info_shape("x", "/models/x", status="stopped")
    assert si["served_model_name"] == "x" and si["model_path"] == "/models/x"
    assert "version" in si and si["internal_states"][0]["status"] == "stopped"
    assert sum_loads([]) == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    got = sum_loads(  # /v1/loads entries of two engines
        [
            [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 1, "num_used_tokens": 10}],
            [
                {"dp_rank": 0, "num_running_reqs": 1, "num_used_tokens": 5, "memory": {}},
                {"dp_rank": 1, "num_running_reqs": 4},
            ],
        ]
    )
    assert got == [
        {"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 15},
        {"dp_rank": 1, "num_reqs": 4, "num_waiting_reqs": 0, "num_tokens": 0},
    ]
