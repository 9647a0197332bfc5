"""The pure gateway decisions: desired set from engine states, and reconcile actions."""

from __future__ import annotations

from ktd.gateway import plan
from ktd.gateway.plan import OWNER_LABEL, Desired, Listed, Local, Worker

ME = "host-a/abc"
LABELS = plan.base_labels(ME, "host-a", {"rack": "r1"})


def view(alias: str = "m", state: str = "ready", port: int | None = 30000, **kw: object) -> Local:
    return Local(alias=alias, state=state, host="127.0.0.1", port=port, **kw)  # type: ignore[arg-type]


def seen(url: str, owner: str | None = ME, model: str = "m", wid: str = "id1") -> Listed:
    labels = {OWNER_LABEL: owner} if owner else {}
    return Listed(id=wid, url=url, model_id=model, labels=labels)


def test_only_ready_engines_that_are_not_leaving_are_desired() -> None:
    d = plan.desired_engines(
        [
            view("a", port=1),
            view("b", "starting", port=2),
            view("c", port=3, leaving=True),
            view("d", "draining", port=4),
            view("e", "stopped", port=None),
        ],
        advertise=None,
        labels=LABELS,
    )
    assert [w.alias for w in d.workers] == ["a"]
    assert d.workers[0].url == "http://127.0.0.1:1"
    assert not d.keep


def test_an_engine_being_readopted_is_kept_not_removed() -> None:
    d = plan.desired_engines([view("a", "starting", adopting=True)], advertise=None, labels=LABELS)
    assert not d.workers and d.keep == {"http://127.0.0.1:30000"}
    assert plan.reconcile(d, [seen("http://127.0.0.1:30000")], ME) == []


def test_shutting_down_wants_nothing() -> None:
    d = plan.desired_engines([view()], advertise=None, labels=LABELS, shutting_down=True)
    assert d == Desired()


def test_labels_name_host_numa_gpus_alias_and_owner() -> None:
    w = plan.engine_worker(view(numa_nodes=(0, 1), gpus=(2,)), advertise="10.1.2.3", labels=LABELS)
    got = w.label_dict()
    assert w.url == "http://10.1.2.3:30000"
    assert got == {
        "host": "host-a",
        "rack": "r1",
        OWNER_LABEL: ME,
        "alias": "m",
        "numa_nodes": "0,1",
        "gpus": "2",
    }


def test_operator_labels_cannot_steal_ownership() -> None:
    labels = plan.base_labels(ME, "h", {OWNER_LABEL: "someone-else", "host": "custom"})
    assert labels[OWNER_LABEL] == ME and labels["host"] == "custom"


def test_advertised_host_rules() -> None:
    assert plan.advertised_host("127.0.0.1", None) == "127.0.0.1"
    assert plan.advertised_host("0.0.0.0", None, fqdn="box.lan") == "box.lan"
    assert plan.advertised_host("0.0.0.0", "10.0.0.9") == "10.0.0.9"
    assert plan.advertised_host("::", "10.0.0.9:8000") == "10.0.0.9"
    assert plan.url_host("::1") == "[::1]"


def test_frontend_url() -> None:
    assert plan.frontend_url("127.0.0.1:8000", None) == "http://127.0.0.1:8000"
    assert plan.frontend_url("0.0.0.0:8000", None, fqdn="box") == "http://box:8000"
    assert plan.frontend_url("0.0.0.0:8000", "10.0.0.2") == "http://10.0.0.2:8000"
    assert plan.frontend_url("0.0.0.0:8000", "gw.example:443") == "http://gw.example:443"


def test_reconcile_adds_what_is_missing() -> None:
    w = Worker(url="http://h:1", model_id="m")
    acts = plan.reconcile(Desired((w,)), [], ME)
    assert [(a.kind, a.url) for a in acts] == [("add", "http://h:1")]
    assert acts[0].worker is w


def test_reconcile_removes_only_our_stale_workers() -> None:
    acts = plan.reconcile(
        Desired(),
        [
            seen("http://h:1", wid="x"),
            seen("http://other:1", owner="host-b/zz"),
            seen("http://s:1", None),
        ],
        ME,
    )
    assert [(a.kind, a.url, a.worker_id) for a in acts] == [("remove", "http://h:1", "x")]


def test_reconcile_present_is_a_no_op_and_trailing_slash_is_the_same_url() -> None:
    w = Worker(url="http://h:1", model_id="m")
    assert plan.reconcile(Desired((w,)), [seen("http://h:1/")], ME) == []
    # Registered by someone else (static --worker-urls): present, not ours to touch.
    assert plan.reconcile(Desired((w,)), [seen("http://h:1", owner=None)], ME) == []


def test_reconcile_model_change_is_remove_then_add() -> None:
    w = Worker(url="http://h:1", model_id="new")
    acts = plan.reconcile(Desired((w,)), [seen("http://h:1", model="old")], ME)
    assert [a.kind for a in acts] == ["remove", "add"]


def test_registration_state() -> None:
    w = Worker(url="http://h:1", model_id="m")
    want, none = Desired((w,)), Desired()
    assert plan.registration_state("http://h:1", want, None) == "unknown"
    assert plan.registration_state("http://h:1", want, [seen("http://h:1")]) == "registered"
    sick = Listed(id="1", url="http://h:1", healthy=False)
    assert plan.registration_state("http://h:1", want, [sick]) == "unhealthy"
    assert plan.registration_state("http://h:1", want, []) == "registering"
    assert plan.registration_state("http://h:1", none, [seen("http://h:1")]) == "deregistering"
    assert plan.registration_state("http://h:1", none, []) == "absent"


def test_backoff_grows_and_caps() -> None:
    assert plan.backoff(0, 0.5, 30) == 0
    assert [plan.backoff(n, 0.5, 4) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 4, 4]


def test_desired_frontend() -> None:
    d = plan.desired_frontend("http://h:8000", "m", LABELS, up=True, shutting_down=False)
    assert d.workers[0].url == "http://h:8000" and d.workers[0].alias is None
    assert plan.desired_frontend("u", "m", {}, up=False, shutting_down=False) == Desired()
    assert plan.desired_frontend("u", "m", {}, up=True, shutting_down=True) == Desired()


def test_reconcile_label_drift_is_an_update_in_place() -> None:
    w = Worker(url="http://h:1", model_id="m", labels=((OWNER_LABEL, ME), ("rack", "r2")))
    s = Listed(id="x", url="http://h:1", model_id="m",
             labels={OWNER_LABEL: ME, "rack": "r1", "model_path": "/m"})  # fmt: skip
    acts = plan.reconcile(Desired((w,)), [s], ME)
    assert [(a.kind, a.worker_id) for a in acts] == [("update", "x")]
    # The router's own labels (model_path, dp_size...) are not drift.
    same = Listed(id="x", url="http://h:1", model_id="m",
                labels={OWNER_LABEL: ME, "rack": "r2", "model_path": "/m"})  # fmt: skip
    assert plan.reconcile(Desired((w,)), [same], ME) == []
