"""Which live worker stands in for a departed trainer (dvml.train.stand_ins): pure, no cluster."""

from __future__ import annotations

from dvml.cluster.workers import WorkerInfo
from dvml.train.stand_ins import pick_stand_ins


def _w(name: str, instance: int | None, port: int) -> WorkerInfo:
    return WorkerInfo(
        address=f"tcp://10.0.0.{instance or 0}:{port}", name=name, host=f"h{instance}",
        vineyard_socket=f"/s/{instance}.sock", vineyard_instance_id=instance, gpus=(), pid=port,
    )  # fmt: skip


A0, A1, B0, B1 = _w("a-0", 1, 1), _w("a-1", 1, 2), _w("b-0", 2, 3), _w("b-1", 2, 4)


def test_a_live_worker_of_the_departed_trainers_vineyardd_stands_in() -> None:
    # b-1 trained instance 2 and died; b-0 serves the same vineyardd and trains nothing
    assert pick_stand_ins([B1], [A0, B1], [A0, A1, B0]) == {B1.address: B0}


def test_no_stand_in_where_the_host_died_or_every_worker_of_it_trains() -> None:
    assert pick_stand_ins([B1], [A0, B1], [A0, A1]) == {}  # instance 2 gone with its host
    assert pick_stand_ins([B1], [B0, B1], [B0]) == {}  # b-0 trains already
    assert pick_stand_ins([_w("x", None, 9)], [A0], [A0, A1]) == {}  # no instance known


def test_a_worker_back_under_a_departed_name_or_one_that_left_is_not_taken() -> None:
    back = _w("b-1", 2, 5)  # b-1's Nanny restarted it: same name, new address
    assert pick_stand_ins([B1], [A0, B1], [A0, back]) == {}
    assert pick_stand_ins([B1], [A0, B1], [A0, B0], left={"b-0"}) == {}


def test_each_stand_in_serves_one_departed_trainer() -> None:
    c0, c1 = _w("c-0", 3, 6), _w("c-1", 3, 7)
    chosen = pick_stand_ins([B1, c1], [A0, B1, c1], [A0, A1, B0, c0])
    assert chosen == {B1.address: B0, c1.address: c0}
