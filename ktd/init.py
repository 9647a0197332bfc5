"""``ktd init``: a starter ``config.json`` + ``models.json`` that validate, with the help beside.

JSON has no comments and the config schema rejects unknown fields (a typo must
never pass silently), so the explanations go into ``config.README.txt`` next to
the two files rather than a ``"_comment"`` key. Nothing is ever overwritten: an
operator's working config is worth more than a template.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ktd import paths
from ktd.core.modelfields import readme_lines

STARTER_CONFIG: dict[str, Any] = {
    "ktransformers": {
        "enabled": True,
        "host": "127.0.0.1",
        "port": 0,
        "ctx": 32768,
        "extra_args": [],
        "extra_env": {},
        "auto_build": False,
    },
    "models_file": "models.json",
    "daemon": {"health_timeout": 1800, "drain_timeout": 60},
    "frontend": {"bind": "127.0.0.1:8000", "api_keys": []},
}

STARTER_MODELS: list[dict[str, Any]] = [
    {
        "path": "/models/DeepSeek-V3",
        "backend": "kt",
        "alias": "deepseek-v3-kt",
        "kt": {
            "kt_weight_path": "/models/DeepSeek-V3-kt",
            "extra_args": ["--kt-method", "AMXINT4", "--kt-num-gpu-experts", "0"],
        },
        "numa": "auto",
        "gpus": "auto",
        "ttl": 0,
        "fit": "check",
    }
]

README = """\
ktd configuration, written by `ktd init`.

config.json (JSON allows no comments, so they live here):
  ktransformers   defaults for every model: host/port of the SGLang engines
                  (port 0 = pick a free one), ctx (--context-length), extra_args
                  (extra sglang.launch_server flags), extra_env, and "python": the
                  interpreter of SGLang's venv (default: the one running ktd).
  models_file     models.json, relative to config.json.
  daemon          health_timeout (s a load may take), drain_timeout, state_dir, ...
  frontend        bind (HOST:PORT of the OpenAI endpoint), api_keys (Bearer keys),
                  keys (named keys: name, key or key_sha256, models, admin,
                  max_concurrent, tokens_per_day, priority; see the README),
                  ui_control (the dashboard at /ui may load/evict/reload; needs
                  api_keys or an admin key), allowed_origins and allowed_hosts
                  (other sites' pages and host names browsers may use; none by
                  default), metrics_public (/metrics without a key).

models.json: one entry per model (the dashboard's editor and `ktctl config set`
show these too).
{fields}

Next steps:
  1. Edit the paths in models.json (the starter ones are placeholders), or let ktd
     fetch a model of its catalog and write its entry: `ktctl catalog`, then
     `ktctl pull NAME` (ktd must be running: step 3).
  2. ktctl doctor --config {config}       (checks machine, SGLang, kt-kernel, paths)
  3. ktd up --config {config}             (daemon + frontend), or `ktd serve` under systemd
  4. ktctl load --estimate deepseek-v3-kt  (memory needed vs free), then ktctl load ...
"""


def write_starter(config: Path) -> list[Path]:
    """Write config.json, models.json and config.README.txt; refuse if any exists."""
    config = config.expanduser()
    folder = config.parent
    models = folder / "models.json"
    readme = folder / "config.README.txt"
    existing = [p for p in (config, models, readme) if p.exists()]
    if existing:
        names = ", ".join(str(p) for p in existing)
        raise FileExistsError(f"refusing to overwrite {names}")
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(STARTER_CONFIG, models_file=models.name)
    # "x": exclusive create, so a file that appeared meanwhile is not clobbered either.
    with config.open("x") as f:
        f.write(json.dumps(cfg, indent=2) + "\n")
    with models.open("x") as f:
        f.write(json.dumps(STARTER_MODELS, indent=2) + "\n")
    with readme.open("x") as f:
        f.write(README.format(config=config, fields="\n".join(readme_lines())))
    return [config, models, readme]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="ktd init",
        description="Write a starter config.json and models.json (never overwrites).",
    )
    ap.add_argument(
        "--config", help=f"where to write config.json (default: {paths.default_config_path()})"
    )
    args = ap.parse_args(argv)
    target = Path(args.config) if args.config else paths.default_config_path()
    try:
        written = write_starter(target)
    except FileExistsError as exc:
        print(f"ktd init: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"ktd init: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    print(f"next: edit the model paths in {written[1]}, then `ktctl doctor --config {target}`")
    return 0
