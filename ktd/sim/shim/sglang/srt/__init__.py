"""``sglang.srt`` of the shim: only ``server_args`` (the option list ktd's probe reads)."""
