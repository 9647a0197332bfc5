"""The control protocol's config messages (``ktd.protocol`` re-exports them): read the
config with its version, plan a change, apply it, the history, a rollback (issue 39).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ktd.protocol_base import ErrorCode, Reply, Request

# ---------------------------------------------------------------- requests


# The config, changed through the daemon (issue 39): read it with its version id, plan a
# change (what each engine would do; what SGLang or the machine would refuse), apply it
# against the version read (a stale base is refused), keep the versions, go back.
#: A config file's text on the wire: a request frame is at most MAX_FRAME and may carry
#: both files, so each is bounded below half of it (a bigger config is edited by hand).
MAX_CONFIG_TEXT = 480 << 10
ConfigText = Annotated[str, msgspec.Meta(max_length=MAX_CONFIG_TEXT)]
VersionId = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[0-9a-f]*$")]
Seq = Annotated[int, msgspec.Meta(ge=1, le=2**53)]
# Who made a change, as the client says (ktctl: the login name; the dashboard: the key's
# name): kept as *claimed*, beside the uid the daemon reads off the socket itself.
Claimed = Annotated[str, msgspec.Meta(max_length=128)]


class ConfigGet(Request, tag="config_get"):
    """The config's files as they are on disk now, or version ``seq`` of the history, and
    their version id: the ``base`` of a later ``config_apply``."""

    seq: Seq | None = None
    delegated: bool = False  # asked for someone else (the dashboard): an owner's reply lowered


class ConfigPlan(Request, tag="config_plan"):
    """What applying these texts would do; nothing is changed. A text left ``None`` is
    that file as it is on disk. ``base``: the version they were made from ("" none).
    ``delegated``: the client acts for someone else (the dashboard, for an admin key):
    the daemon gives the request no more than a non-owner's rights (docs/security.md)."""

    config_text: ConfigText | None = None
    models_text: ConfigText | None = None
    base: VersionId = ""
    delegated: bool = False


class ConfigApply(Request, tag="config_apply"):
    """Plan, then (when nothing in the plan is an error, and the files on disk are still
    version ``base``) write the files and apply them as a reload does; recorded in the
    history with ``author`` (claimed) and the socket's uid. ``base`` is required: ""
    (left out) is refused with ``bad_request``."""

    config_text: ConfigText | None = None
    models_text: ConfigText | None = None
    base: VersionId = ""
    author: Claimed = ""
    delegated: bool = False


class ConfigHistory(Request, tag="config_history"):
    """The versions kept, newest first: who (uid, and the author claimed), when, what."""


class ConfigRollback(Request, tag="config_rollback"):
    """Apply version ``seq`` of the history again (None: the one before the files now),
    through the same path as any change; ``dry_run``: only its plan."""

    seq: Seq | None = None
    base: VersionId = ""  # required unless dry_run
    author: Claimed = ""
    dry_run: bool = False
    delegated: bool = False


# ---------------------------------------------------------------- replies


class FieldChange(msgspec.Struct, kw_only=True):
    """One value a change sets: ``field`` as the file names it (``kt.ctx``, or
    ``ktransformers.ctx`` when the entry takes the section's), JSON values."""

    field: str
    old: Any = None
    new: Any = None


class EnginePlan(msgspec.Struct, kw_only=True):
    """What applying does to one model's engine.

    ``action``: ``unchanged``; ``update`` (applied live: limits, TTL...; nothing
    restarts); ``restart`` (its launch changed: stopped and started again when idle);
    ``add`` (new: stopped until a request or ``ktctl load``); ``remove`` (gone from the
    config, nothing runs); ``stop`` (gone, or asleep with a new launch: drained and
    stopped); ``sleep`` (put to sleep to make room for a restarted engine); ``start``
    (served again). ``fields`` say why (what changed).
    """

    alias: str
    action: str
    state: str = ""  # the engine's state now ("" for a new model)
    fields: list[FieldChange] = []
    note: str = ""  # when, and what else it means, for people


class ConfigProblem(msgspec.Struct, kw_only=True):
    """Something wrong with a change; an ``error`` refuses it, a ``warning`` is told."""

    level: str  # "error" or "warning"; an open vocabulary (docs/protocol.md): tolerate others
    message: str
    file: str = ""
    path: str = ""  # the field: ``$[0].kt.extra_args``
    alias: str = ""
    code: str = ""  # an ErrorCode when it is not the config's fault (``busy``: a load under way)


class SettingChange(msgspec.Struct, kw_only=True):
    """A config.json setting that changes, and when it takes effect (``now``, ``at ktd's
    restart``, ``at the frontend's restart``)."""

    field: str
    old: Any = None
    new: Any = None
    effect: str = "now"


class ConfigPlanView(msgspec.Struct, kw_only=True):
    """What a change would do (``ktd.core.configplan``)."""

    base: str  # the version of the files on disk the plan was made against
    version: str  # the version the change makes
    running: str = ""  # the version the daemon runs (differs from base after a hand edit)
    changed: list[str] = []  # files that would be written
    engines: list[EnginePlan] = []
    settings: list[SettingChange] = []
    problems: list[ConfigProblem] = []
    ok: bool = True  # no problem is an error
    summary: str = ""


def plan_refusal(plan: ConfigPlanView) -> tuple[str, str, ConfigProblem | None]:
    """A refused plan as the change's error, built once for both ends: the daemon raises
    it for an apply, ktctl says it for a plan it will not apply. (the code, the sentence,
    the error it names): ``config_error`` naming the file and field of the first error
    that is the config's own (one with no code), else the first error's own code
    (``stale_config``, ``busy``: nothing wrong with the config, the moment is)."""
    errors = [q for q in plan.problems if q.level == "error"]
    if not errors:  # not ok with no error: a daemon of another kind; said as it is
        return ErrorCode.CONFIG_ERROR, "the plan was refused; nothing was changed", None
    own = [q for q in errors if not q.code]
    first = (own or errors)[0]
    where = f"{first.file}: {first.path}: " if first.path else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    code = ErrorCode.CONFIG_ERROR if own else first.code
    return code, f"{where}{first.message}{more}; nothing was changed", first


class ConfigVersion(msgspec.Struct, kw_only=True):
    """One version of the config in the history."""

    seq: int
    version: str
    time: float  # wall clock
    how: str  # "start", "reload" (a hand edit seen), "apply", "rollback", "pull"
    uid: int | None = None  # read off the control socket (SO_PEERCRED): who really asked
    user: str | None = None  # that uid's name
    claimed: str = ""  # who the client said it was (not verified)
    what: str = ""  # the change, in a line
    files: list[str] = []  # files that changed against the version before
    rollback_of: int | None = None


class ConfigReply(Reply, tag="config"):
    version: str
    running: str = ""
    config_path: str = ""
    config_text: str = ""
    models_path: str = ""
    models_text: str | None = None  # None: no models file
    seq: int | None = None  # the history entry with these files, if any
    # Secrets marked (``•••• secret #N (unchanged)``; a change that keeps a mark keeps
    # the secret): every reply but the owner's (docs/security.md)
    redacted: bool = False


class ConfigPlanReply(Reply, tag="config_plan"):
    plan: ConfigPlanView


class ConfigApplyReply(Reply, tag="config_apply"):
    plan: ConfigPlanView
    version: str = ""
    seq: int | None = None  # its entry in the history
    summary: str = ""  # what the reload did


class ConfigHistoryReply(Reply, tag="config_history"):
    versions: list[ConfigVersion] = []  # newest first
    keep: int = 0  # how many the daemon keeps (daemon.config_history)
    running: str = ""
    disk: str = ""  # the version of the files on disk now
