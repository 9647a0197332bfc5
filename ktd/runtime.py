"""What ``ktd serve`` and ``ktd frontend`` share at start-up: options, logging, config, CPUs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ktd import paths
from ktd.core.config import Config, ConfigError
from ktd.core.configload import ConfigTexts, parse_config, read_config_texts


def add_common_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", help="config.json (default: $KTD_CONFIG or the per-user path)")
    ap.add_argument("--socket", help="control socket path (default: $KTD_SOCKET or runtime dir)")
    ap.add_argument("--log-level", default=os.environ.get("KTD_LOG_LEVEL", "INFO"))


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # A request or health check every few seconds is not news; httpx logs each at INFO.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def no_config_message(prog: str, path: Path) -> str:
    """What a first ``ktd serve`` without a config says: how to get one (issue 43: it
    said "cannot read" and nothing of ``ktd init``)."""
    return (
        f"{prog}: config error: no config at {path}.\n"
        f"  ktd init --config {path}   write a starter config.json + models.json there\n"
        "  ktd up --demo   try everything on the simulated engine (no GPU, no SGLang)\n"
        f"  {prog} --config PATH   use a config elsewhere"
    )


def load_or_report(config_arg: str | None, prog: str) -> Config | None:
    """The config, or None after one clear line on stderr (the caller exits 2)."""
    loaded = load_texts_or_report(config_arg, prog)
    return loaded[0] if loaded is not None else None


def load_texts_or_report(config_arg: str | None, prog: str) -> tuple[Config, ConfigTexts] | None:
    """The config and the files' bytes it was read from (the daemon's first version of
    the config), or None after one clear line on stderr (the caller exits 2)."""
    path = Path(config_arg) if config_arg else paths.default_config_path()
    if not path.exists() and not path.is_symlink():
        print(no_config_message(prog, path), file=sys.stderr)
        return None
    try:
        texts = read_config_texts(path)
        config = parse_config(texts)
    except ConfigError as exc:
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        return None
    if config.daemon.cpus:
        # daemon.cpus keeps ktd's own processes off the cores engines are pinned to.
        try:
            os.sched_setaffinity(0, config.daemon.cpus)
        except OSError as exc:
            print(f"{prog}: config error: {config.path}: $.daemon.cpus: {exc}", file=sys.stderr)
            return None
    return config, texts
