"""Make ``docs/dashboard.png``, the README's picture of the dashboard, with a real browser.

    python docs/screenshot.py [--out docs/dashboard.png]

Runs ``ktd serve`` and ``ktd frontend`` on the tests' two-node box (a sysfs fixture
and a fake nvidia-smi: tests/frontend/ui/uienv.py) with sim engines: ``alpha``
serving two streams, ``beta`` loading again (so its card shows the progress bar and
the ETA from its first load), ``qwen3`` of another backend. After about a minute and
a half of traffic (nine samples), Debian's chromium (``tests/ui_install.sh``) opens
``/ui``, selects ``alpha`` and takes the picture. Everything started is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from ktctl import Client  # noqa: E402
from tests.frontend.ui.chrome import start_chrome  # noqa: E402
from tests.frontend.ui.uienv import box_models, machine_env  # noqa: E402

TRAFFIC_SECONDS = 95.0


def stream_forever(url: str, stop: threading.Event) -> None:
    body = {
        "model": "alpha",
        "stream": True,
        "max_tokens": 48,
        "messages": [{"role": "user", "content": "Tell me about NUMA nodes."}],
    }
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for _ in r.iter_bytes():
                    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "docs" / "dashboard.png"))
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ktd-shot-", dir="/tmp"))
    env = machine_env(root, dict(os.environ))
    env.update(
        KTD_RUNTIME_DIR=str(root / "run"),
        KTD_STATE_DIR=str(root / "state"),
        PYTHONPATH=str(REPO),
    )
    models = box_models(root / "models", load_time=0.5, token_rate=40)
    for m in models:
        if m["alias"] == "beta":
            m["kt"]["extra_env"]["KTD_SIM_LOAD_TIME"] = "30"
    (root / "models.json").write_text(json.dumps(models))
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    config = {
        "models_file": "models.json",
        "daemon": {"stop_grace": 5, "drain_timeout": 5, "health_interval": 1},
        "frontend": {"bind": f"127.0.0.1:{port}"},
    }
    (root / "config.json").write_text(json.dumps(config))
    log = open(root / "procs.log", "ab")  # noqa: SIM115
    cfg = ["--config", str(root / "config.json")]
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    driver = None
    try:
        for cmd in ("serve", "frontend"):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ktd", cmd, *cfg], env=env, stdout=log, stderr=log
                )
            )
            time.sleep(1.5)
        sock = root / "run" / "control.sock"
        with Client(sock, timeout=60) as c:
            c.load("alpha")
            c.load("beta")  # its first load: the history the next one's ETA comes from
            c.evict("beta")
        traffic = [threading.Thread(target=stream_forever, args=(url, stop)) for _ in range(2)]
        for t in traffic:
            t.start()
        started = time.monotonic()

        driver = start_chrome(root / "chrome", "--hide-scrollbars", "--window-size=1400,1400")
        driver.get(url + "/ui")
        time.sleep(3)
        driver.execute_script("document.querySelector(\".card[data-alias='alpha']\").click()")
        time.sleep(max(0.0, TRAFFIC_SECONDS - 12 - (time.monotonic() - started)))
        with Client(sock, timeout=60) as c:
            c.load("beta", wait=False)  # half way through at the picture: progress and ETA
        time.sleep(12)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
        )
        time.sleep(0.5)
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        stop.set()
        if driver is not None:
            driver.quit()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
