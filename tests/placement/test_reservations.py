"""The admission arithmetic of concurrent jobs (pure: no cluster)."""

from __future__ import annotations

from dvml.placement.reservations import admission, refusal_message, reservation_record

MiB = 2**20


def _running(job: str, machines: dict[str, int]) -> dict[str, object]:
    return reservation_record(job, "client-1", 42, "here", 35.0, "now", job, machines)


def test_a_job_that_fits_beside_the_running_ones_is_admitted() -> None:
    running = [_running("dvml.fit of model 'a'", {"host-0 + host-1": 600 * MiB})]
    assert admission({"host-0 + host-1": 400 * MiB}, {"host-0 + host-1": 1000 * MiB}, running) == []


def test_jobs_are_refused_by_their_sum_naming_the_running_job() -> None:
    running = [_running("dvml.fit of model 'a'", {"host-0 + host-1": 600 * MiB})]
    shorts = admission({"host-0 + host-1": 401 * MiB}, {"host-0 + host-1": 1000 * MiB}, running)
    assert [(s.machine, s.needed, s.free) for s in shorts] == [
        ("host-0 + host-1", 401 * MiB, 400 * MiB)
    ]
    message = refusal_message("dvml.fit of model 'b'", shorts)
    assert "dvml.fit of model 'a' (600.0 MiB)" in message, message
    assert "No trainer was started" in message and "Received:" in message


def test_machines_that_share_a_host_count_against_each_other() -> None:
    # 'a' runs on host-0 only; 'b' on the machine of host-0 and host-1 (one kernel)
    running = [
        _running("a", {"host-0": 300 * MiB}),
        _running("c", {"host-7": 900 * MiB}),  # another machine: not counted
    ]
    shorts = admission({"host-0 + host-1": 800 * MiB}, {"host-0 + host-1": 1000 * MiB}, running)
    assert [s.held for s in shorts] == [(("a", 300 * MiB),)]
    assert admission({"host-0 + host-1": 700 * MiB}, {"host-0 + host-1": 1000 * MiB}, running) == []


def test_no_running_job_leaves_the_plan_alone_to_decide() -> None:
    assert admission({"host-0": 10 * MiB}, {"host-0": 100 * MiB}, []) == []
