"""Pure parts of the canary I/O: pod addressing, Ready-pod selection, gate summaries, baseline windows."""

from __future__ import annotations

from modeldeploy.conformance.result import CheckResult
from modeldeploy.conformance.suite import Report
from modeldeploy.operator.analysis.gate import summarize
from modeldeploy.operator.analysis.pods import pod_url, ready_pod_ips
from modeldeploy.operator.analysis.scrape import Baselines, CohortScrape
from modeldeploy.operator.analysis.verdicts import CohortSample


def test_pod_url_forms() -> None:
    assert pod_url("10.0.0.1") == "http://10.0.0.1:8000"
    assert pod_url("10.0.0.1", 9000) == "http://10.0.0.1:9000"
    assert pod_url("127.0.0.1:8123") == "http://127.0.0.1:8123"
    assert pod_url("fd00::1") == "http://[fd00::1]:8000"
    assert pod_url("[fd00::1]:9000") == "http://[fd00::1]:9000"


def _pod(name: str, ip: str | None, ready: bool) -> dict:
    st = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        st["podIP"] = ip
    return {"metadata": {"name": name}, "status": st}


def test_ready_pod_ips_only_ready_with_address_by_name() -> None:
    pods = [
        _pod("c", "10.0.0.3", True),
        _pod("a", "10.0.0.1", True),
        _pod("b", "10.0.0.2", False),
        _pod("d", None, True),
    ]
    assert ready_pod_ips(pods) == ["10.0.0.1", "10.0.0.3"]


def _report(*checks: CheckResult) -> Report:
    return Report({}, None, list(checks), "2026-01-01T00:00:00+00:00", 3.21, [])


def test_summarize_pass_and_fail() -> None:
    assert summarize(_report(CheckResult("readiness"), CheckResult("streaming"))) == (
        True,
        "conformance passed: 2 checks in 3.2s",
    )
    bad = CheckResult("streaming")
    bad.expect(False, "no [DONE] event")
    optional = CheckResult("usage_accounting", required=False)
    optional.expect(False, "not counted")  # not required: does not fail the gate
    passed, text = summarize(_report(CheckResult("readiness"), bad, optional))
    assert not passed and text == "conformance failed checks: streaming (streaming: no [DONE] event)"
    assert summarize(_report()) == (False, "conformance failed: no checks ran")


def test_summarize_is_bounded() -> None:
    bad = CheckResult("error_handling")
    bad.expect(False, "x" * 5000)
    passed, text = summarize(_report(bad), limit=200)
    assert not passed and len(text) == 200 and text.endswith("…")


TEXT = """# TYPE modeldeploy_requests_total counter
modeldeploy_requests_total{{bundle="b",outcome="completed"}} {done}
modeldeploy_requests_total{{bundle="b",outcome="error"}} {err}
# TYPE modeldeploy_time_to_first_token_seconds histogram
modeldeploy_time_to_first_token_seconds_bucket{{bundle="b",le="0.1"}} {fast}
modeldeploy_time_to_first_token_seconds_bucket{{bundle="b",le="+Inf"}} {total}
modeldeploy_time_to_first_token_seconds_count{{bundle="b"}} {total}
modeldeploy_time_to_first_token_seconds_sum{{bundle="b"}} 1.0
"""


def sample(done: int, err: int = 0, fast: int | None = None) -> CohortSample:
    total = done + err
    return CohortSample.from_text(
        TEXT.format(done=done, err=err, fast=total if fast is None else fast, total=total), "b"
    )


def test_baselines_window_per_pod_new_pod_and_restart() -> None:
    base = Baselines()
    start = CohortScrape("b", {"p1": sample(10), "p2": sample(4)})
    assert base.delta("u", "b", 0, start).finished == 0  # opens the window
    later = CohortScrape("b", {"p1": sample(15, 1), "p2": sample(2), "p3": sample(3)})
    d = base.delta("u", "b", 0, later)
    # p1: +5 completed +1 error; p2 restarted (4 -> 2): its 2 count; p3 new since the window: all 3
    assert d.outcomes == {"completed": 10.0, "error": 1.0}
    assert d.ttft.count == 11
    assert base.delta("u", "b", 1, later).finished == 0  # next step: new window
    assert base.delta("u", "other", 0, later).finished == 0  # keys are per bundle
    base.forget("u", "other")
    assert len(base) == 3
    base.forget("u")
    assert len(base) == 0


def test_cohort_scrape_sum_and_problems() -> None:
    s = CohortScrape("b", {"p1": sample(2), "p2": sample(3)}, {"p9": "unreachable (ConnectError)"}, ("p10",))
    assert s.sample.outcomes["completed"] == 5 and s.sample.ttft.count == 5
    assert (
        s.problems()
        == "bundle b: p9: unreachable (ConnectError); 1 pod(s) over the 32-pod scrape bound not read"
    )
    assert CohortScrape("b", {"p1": sample(1)}).problems() == ""


def test_rollout_modules_leave_out_torch_and_the_runtime() -> None:
    """The operator image has no torch: these modules are imported by it."""
    import subprocess
    import sys

    code = (
        "import sys, modeldeploy.operator.analysis.sources, modeldeploy.operator.analysis.gate, "
        "modeldeploy.operator.rollout.routing, modeldeploy.operator.rollout_cli\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
        "or m.startswith('modeldeploy.runtime')]\nprint(bad)\nsys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
