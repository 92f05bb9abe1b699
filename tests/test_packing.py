"""A message's arrays packed into one array (pflower.runtime.packing): every array comes back with
the same bytes, dtype, shape and stype; other records are left alone; fewer objects travel; the
ClientApp's mod unpacks only packed messages and packs only their replies."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.task_identity import TaskIdentity

from pflower.runtime.packing import (
    PACKED_KEY,
    PackedArrays,
    is_packed,
    pack,
    pack_record,
    packed_arrays_mod,
    unpack,
    unpack_record,
)

ARRAYS = {
    "conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "scalar": np.array(3.5, dtype=np.float64),
    "empty": np.zeros((0, 5), dtype=np.float32),
    "steps": np.array([1, -2, 3], dtype=np.int64),
    "mask": np.array([True, False]),
}


def record() -> ArrayRecord:
    return ArrayRecord(array_dict={k: Array(v) for k, v in ARRAYS.items()})


def objects(obj: object) -> int:
    """How many objects Flower moves for ``obj`` (it and all its descendants)."""
    return 1 + sum(objects(child) for child in (obj.children or {}).values())  # type: ignore[attr-defined]


def test_a_packed_record_is_one_array_and_unpacks_to_the_same_arrays() -> None:
    packed = pack_record(record())
    assert list(packed.keys()) == [PACKED_KEY]
    unpacked = unpack_record(packed)
    assert list(unpacked.keys()) == list(ARRAYS)
    for key, expected in ARRAYS.items():
        got = unpacked[key].numpy()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    assert unpacked.object_id == record().object_id, "the very same record, byte for byte"


def test_pack_packs_only_array_records_of_several_arrays() -> None:
    single = ArrayRecord(array_dict={"w": Array(np.ones(3))})
    config = ConfigRecord({"lr": 0.1, "round": 2})
    metrics = MetricRecord({"loss": 0.5})
    content = RecordDict({"model": record(), "head": single, "config": config, "m": metrics})
    packed = pack(content)
    assert list(packed.keys()) == ["model", "head", "config", "m"]
    assert list(packed["model"].keys()) == [PACKED_KEY]
    assert packed["head"].object_id == single.object_id
    assert packed["config"].object_id == config.object_id
    assert is_packed(packed) and not is_packed(content)
    assert unpack(packed).object_id == content.object_id


def test_records_that_share_their_arrays_share_one_packed_array() -> None:
    """A round's messages all carry the global model (the same bytes): packed once, not once
    per client; a record with other bytes (a client's own model) gets its own."""
    parameters = ndarrays_to_parameters([np.ones(3), np.zeros(2)])
    contents = [
        compat.fitins_to_recorddict(FitIns(parameters, {"client": c}), keep_input=True)
        for c in range(3)
    ]
    other = ndarrays_to_parameters([np.ones(3), np.zeros(2)])  # equal values, other bytes
    contents.append(compat.fitins_to_recorddict(FitIns(other, {}), keep_input=True))
    shared: PackedArrays = {}
    packed = [pack(content, shared)["fitins.parameters"][PACKED_KEY].data for content in contents]
    assert packed[0] is packed[1] is packed[2], "one copy of the packed bytes"
    assert packed[3] is not packed[0] and packed[3] == packed[0]
    assert len(shared) == 2


def test_a_train_message_moves_far_fewer_objects_packed() -> None:
    model = [np.ones((8, 1, 5, 5)), np.ones(8), np.ones((10, 8)), np.ones(10)]
    content = compat.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters(model), {"lr": 0.1}), keep_input=True
    )
    # RecordDict, ArrayRecord, 4 x (Array + chunk), ConfigRecord -> 1 Array + 1 chunk
    assert (objects(content), objects(pack(content))) == (11, 5)
    ins = compat.recorddict_to_fitins(unpack(pack(content)), keep_input=True)
    for got, expected in zip(parameters_to_ndarrays(ins.parameters), model, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_packed_array_whose_layout_does_not_cover_it_is_refused() -> None:
    packed = pack_record(record())
    array = packed[PACKED_KEY]
    longer = Array(dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data + b"x")
    with pytest.raises(ValueError, match="whose layout covers"):
        unpack_record(ArrayRecord(array_dict={PACKED_KEY: longer}))


@pytest.fixture
def in_a_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Messages can only be made inside a run."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    yield


def echo_plus_one(seen: list[RecordDict]) -> ClientAppCallable:
    """A client that records what it received and replies with its arrays plus one."""

    def client_app(message: Message, _context: object) -> Message:
        seen.append(message.content)
        arrays = message.content["model"]
        reply = ArrayRecord(
            array_dict={k: Array(np.asarray(a.numpy() + 1)) for k, a in arrays.items()}
        )
        return Message(RecordDict({"model": reply}), reply_to=message)

    return client_app


def test_the_mod_unpacks_a_packed_message_and_packs_its_reply(in_a_run: None) -> None:
    seen: list[RecordDict] = []
    message = Message(pack(RecordDict({"model": record()})), dst_node_id=1, message_type="train")
    reply = packed_arrays_mod(message, None, echo_plus_one(seen))  # type: ignore[arg-type]
    assert seen[0].object_id == RecordDict({"model": record()}).object_id
    assert is_packed(reply.content)
    returned = unpack(reply.content)["model"]
    np.testing.assert_array_equal(returned["steps"].numpy(), ARRAYS["steps"] + 1)


def test_the_mod_passes_an_unpacked_message_and_its_reply_untouched(in_a_run: None) -> None:
    seen: list[RecordDict] = []
    content = RecordDict({"model": record()})
    message = Message(content, dst_node_id=1, message_type="train")
    reply = packed_arrays_mod(message, None, echo_plus_one(seen))  # type: ignore[arg-type]
    assert seen[0] is content
    assert not is_packed(reply.content)
    assert list(reply.content["model"].keys()) == list(ARRAYS)
