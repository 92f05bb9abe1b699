"""A message's arrays as one Array: fewer objects for a deployment to move.

Flower 1.39 moves a message as a tree of objects: the message, its ``RecordDict``, each record,
each ``Array`` and each array's chunks. A SuperNode pulls them from the SuperLink, and its
ClientApp from the SuperNode, one request per object (two at a time), and a reply travels back
the same way. A FedAvgCNN model is 8 tensors, so 16 of the 19 objects of a ``train``
message's content are its arrays and their chunks; packed, the content is 5 objects.

In a deployment the ServerApp sends every ``ArrayRecord`` of more than one array as one array
([`pack`][pflower.runtime.packing.pack]: a JSON layout, then every array's bytes one after the
other), the ClientApp's
[`packed_arrays_mod`][pflower.runtime.packing.packed_arrays_mod] gives the client the records as
they were ([`unpack`][pflower.runtime.packing.unpack]) and packs
its reply's records the same way, and the ServerApp unpacks the reply. Each array's bytes,
dtype, shape and ``stype`` travel unchanged, so every result is bit-identical to unpacked
messages. A simulation's rounds are sent the same way
([`SimulationGrid`][pflower.runtime.polling.SimulationGrid]): its fork workers receive one
array per record through their pipes. A message with nothing packed passes the mod untouched,
and so does its reply. (It lives in [`pflower.runtime`][pflower.runtime] for the type of
a ClientApp
mod's ``call_next``, ``flwr.clientapp.typing.ClientAppCallable``, outside Flower's API reference.)
"""

from __future__ import annotations

import json
from typing import TypeGuard

from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable

PACKED_KEY = "pflower.packed"
"""The one key of a packed ``ArrayRecord``."""

PACKED_STYPE = "pflower.packed/v1"
"""The ``stype`` of the one array of a packed ``ArrayRecord``."""

_LENGTH_BYTES = 8


PackedArrays = dict[tuple[tuple[str, int], ...], Array]
"""Packed arrays by the records they were packed from: ``(key, id(bytes))`` of each array. Valid
only while those bytes live (one round's messages), so that records sharing their arrays (a
round's global model, in every client's message) share one packed copy of the bytes instead of
one each."""


def pack_record(record: ArrayRecord, shared: PackedArrays | None = None) -> ArrayRecord:
    """``record``'s arrays as one array: an 8-byte length, a JSON layout (key, dtype, shape,
    stype, byte count of each array, in order), then the arrays' bytes. With ``shared``, a
    record whose arrays are the very bytes of a record packed before reuses that packed array."""
    identity = tuple((key, id(array.data)) for key, array in record.items())
    if shared is not None and identity in shared:
        return ArrayRecord(array_dict={PACKED_KEY: shared[identity]})
    layout = [
        {
            "key": key,
            "dtype": array.dtype,
            "shape": list(array.shape),
            "stype": array.stype,
            "size": len(array.data),
        }
        for key, array in record.items()
    ]
    header = json.dumps(layout).encode()
    data = b"".join(
        [len(header).to_bytes(_LENGTH_BYTES, "little"), header]
        + [array.data for array in record.values()]
    )
    packed = Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)
    if shared is not None:
        shared[identity] = packed
    return ArrayRecord(array_dict={PACKED_KEY: packed})


def is_packed_record(record: object) -> TypeGuard[ArrayRecord]:
    """Whether ``record`` is an ``ArrayRecord`` that
    [`pack_record`][pflower.runtime.packing.pack_record] made."""
    return (
        isinstance(record, ArrayRecord)
        and list(record.keys()) == [PACKED_KEY]
        and record[PACKED_KEY].stype == PACKED_STYPE
    )


def unpack_record(record: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` that [`pack_record`][pflower.runtime.packing.pack_record] packed into
    ``record``."""
    data = record[PACKED_KEY].data
    start = _LENGTH_BYTES + int.from_bytes(data[:_LENGTH_BYTES], "little")
    layout = json.loads(data[_LENGTH_BYTES:start])
    arrays: dict[str, Array] = {}
    for entry in layout:
        end = start + entry["size"]
        arrays[entry["key"]] = Array(
            dtype=entry["dtype"],
            shape=tuple(entry["shape"]),
            stype=entry["stype"],
            data=data[start:end],
        )
        start = end
    if start != len(data):
        raise ValueError(f"a packed array of {len(data)} bytes whose layout covers {start}")
    return ArrayRecord(array_dict=arrays)


def pack(content: RecordDict, shared: PackedArrays | None = None) -> RecordDict:
    """``content`` with every ``ArrayRecord`` of more than one array packed into one array
    (reusing the packed arrays in ``shared``: [`pack_record`][pflower.runtime.packing.pack_record]);
    the other records (and their
    order) as they are."""
    return RecordDict(
        {
            name: pack_record(record, shared)
            if isinstance(record, ArrayRecord) and len(record) > 1
            else record
            for name, record in content.items()
        }
    )


def is_packed(content: RecordDict) -> bool:
    """Whether any record of ``content`` is packed."""
    return any(is_packed_record(record) for record in content.values())


def unpack(content: RecordDict) -> RecordDict:
    """``content`` with every packed record unpacked (the inverse of
    [`pack`][pflower.runtime.packing.pack])."""
    return RecordDict(
        {
            name: unpack_record(record) if is_packed_record(record) else record
            for name, record in content.items()
        }
    )


def packed_arrays_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """ClientApp mod: a packed message reaches the client unpacked, and its reply goes back
    packed; any other message and its reply pass untouched."""
    if not is_packed(message.content):
        return call_next(message, context)
    message.content = unpack(message.content)
    reply = call_next(message, context)
    if reply.has_content():
        reply.content = pack(reply.content)
    return reply
