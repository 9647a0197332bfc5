"""The sim's environment knobs: timings and injected faults.

Why environment variables and not flags: ktd builds the engine's argv exactly
as it would for real SGLang, and tests must not change that argv to steer the
sim. The environment (``extra_env`` in ktd's config) reaches the engine without
touching the command line, and the scheduler child inherits it.

Stdlib only: the scheduler child imports this module too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "KTD_SIM_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
ORPHANS = ("term", "ignore")  # KTD_SIM_ORPHAN's values


@dataclass(frozen=True)
class Knobs:
    """Every knob, parsed once; bad values fall back to the default with a warning."""

    load_time: float = 0.3  # KTD_SIM_LOAD_TIME: seconds the scheduler "loads weights"
    warmup: float = 0.1  # KTD_SIM_WARMUP: seconds between bind and ready
    token_rate: float = 0.0  # KTD_SIM_TOKEN_RATE: tokens/s per request, 0 = no pacing
    # KTD_SIM_PREFILL_TIME: seconds before a request's first token (a long kt prefill; no
    # load snapshot shows the request meanwhile)
    prefill_time: float = 0.0
    crash_during_load: bool = False  # KTD_SIM_CRASH_DURING_LOAD
    crash_mid_stream: int = 0  # KTD_SIM_CRASH_MID_STREAM: die after N chunks of a stream
    never_healthy: bool = False  # KTD_SIM_NEVER_HEALTHY: /health always 503
    hang_after: float | None = None  # KTD_SIM_HANG_AFTER: seconds after ready, then hang
    ignore_sigterm: bool = False  # KTD_SIM_IGNORE_SIGTERM
    escape: bool = False  # KTD_SIM_ESCAPE: a grandchild leaves the session
    # KTD_SIM_ORPHAN: "term" or "ignore": a helper of the server without PDEATHSIG, that
    # the server's own clean-up does not know, outlives it; it dies of SIGTERM ("term")
    # or ignores it ("ignore"). "" = none.
    orphan: str = ""
    drain: float = 5.0  # KTD_SIM_DRAIN: max seconds in-flight requests get on SIGTERM
    health_time: float = 0.01  # KTD_SIM_HEALTH_TIME: a /health token's cost without TOKEN_RATE
    health_timeout: float = 20.0  # KTD_SIM_HEALTH_TIMEOUT: SGLANG_HEALTH_CHECK_TIMEOUT
    crash_diag: float = 5.0  # KTD_SIM_CRASH_DIAG: SGLang's wait "before crash diagnostics"
    record: str | None = None  # KTD_SIM_RECORD: path of the start-up record (JSON)
    # SGLang's memory API (ktd/sim/memory.py): seconds a release and a resume take, and
    # a resume that fails (answers an error, stays released) or never answers.
    release_time: float = 0.05  # KTD_SIM_RELEASE_TIME
    resume_time: float = 0.05  # KTD_SIM_RESUME_TIME
    resume_fail: bool = False  # KTD_SIM_RESUME_FAIL
    resume_hang: bool = False  # KTD_SIM_RESUME_HANG
    # KTD_SIM_HOLD: a generation's tokens after its first wait until a test opens the
    # sim's gate (``POST /sim/gate``): a stream that outlives whatever races it, for as
    # long as the test needs and no longer (instead of a pace that outlasts it).
    hold: bool = False
    # KTD_SIM_NO_DOOR: an SGLang without ``/pause_generation`` and ``/continue_generation``
    # (404, FastAPI's): ktd's sleep has no door to close and fences on zero readings.
    no_door: bool = False
    # KTD_SIM_GPU_EXPERTS_MAX: the most ``--kt-num-gpu-experts`` the "GPU" holds; above it
    # the scheduler dies during the weight load with torch's CUDA out-of-memory error, as
    # SGLang prints it (issue 44: the out-of-memory retry with fewer experts).
    gpu_experts_max: int | None = None

    def token_time(self) -> float:
        """Seconds one token takes: a /health check generates exactly one."""
        return 1.0 / self.token_rate if self.token_rate > 0 else self.health_time

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> tuple[Knobs, list[str]]:
        """Returns the knobs and one warning per value that could not be used."""
        env = os.environ if env is None else env
        warnings: list[str] = []

        def num(name: str, default: float, *, minimum: float = 0.0) -> float:
            raw = env.get(PREFIX + name)
            if raw is None or raw.strip() == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                value = minimum - 1
            if value < minimum or value != value:  # NaN fails both
                warnings.append(
                    f"{PREFIX}{name}={raw!r} is not a number >= {minimum}; using {default}"
                )
                return default
            return value

        def flag(name: str) -> bool:
            raw = env.get(PREFIX + name, "").strip().lower()
            if raw in _TRUE:
                return True
            if raw not in _FALSE:
                warnings.append(f"{PREFIX}{name}={raw!r} is not a boolean; using false")
            return False

        def choice(name: str, allowed: tuple[str, ...]) -> str:
            raw = env.get(PREFIX + name, "").strip().lower()
            if raw and raw not in allowed:
                warnings.append(f"{PREFIX}{name}={raw!r} is not one of {', '.join(allowed)}")
                return ""
            return raw

        hang_after: float | None = None
        if env.get(PREFIX + "HANG_AFTER", "").strip():
            value = num("HANG_AFTER", -1.0)
            hang_after = value if value >= 0 else None
        experts_max: int | None = None
        if env.get(PREFIX + "GPU_EXPERTS_MAX", "").strip():
            value = num("GPU_EXPERTS_MAX", -1.0)
            experts_max = int(value) if value >= 0 else None
        knobs = cls(
            load_time=num("LOAD_TIME", cls.load_time),
            warmup=num("WARMUP", cls.warmup),
            token_rate=num("TOKEN_RATE", cls.token_rate),
            prefill_time=num("PREFILL_TIME", cls.prefill_time),
            crash_during_load=flag("CRASH_DURING_LOAD"),
            crash_mid_stream=int(num("CRASH_MID_STREAM", 0)),
            never_healthy=flag("NEVER_HEALTHY"),
            hang_after=hang_after,
            ignore_sigterm=flag("IGNORE_SIGTERM"),
            escape=flag("ESCAPE"),
            orphan=choice("ORPHAN", ORPHANS),
            drain=num("DRAIN", cls.drain),
            health_time=num("HEALTH_TIME", cls.health_time),
            health_timeout=num("HEALTH_TIMEOUT", cls.health_timeout),
            crash_diag=num("CRASH_DIAG", cls.crash_diag),
            record=env.get(PREFIX + "RECORD") or None,
            release_time=num("RELEASE_TIME", cls.release_time),
            resume_time=num("RESUME_TIME", cls.resume_time),
            resume_fail=flag("RESUME_FAIL"),
            resume_hang=flag("RESUME_HANG"),
            hold=flag("HOLD"),
            no_door=flag("NO_DOOR"),
            gpu_experts_max=experts_max,
        )
        return knobs, warnings
