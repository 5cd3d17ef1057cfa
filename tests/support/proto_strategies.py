"""Hypothesis strategies for any protobuf message, built from its descriptor, and the
mesh's RPCs enumerated from the generated code.

One builder walks ``DESCRIPTOR.fields``, so a field or RPC added to a ``.proto`` is fuzzed
without a change here. Values lean to the edges a hostile peer would send: empty, huge,
negative, NaN and infinities, unicode and NUL, strings up to 1 MB (gRPC's default limit is
4 MB a message), enum numbers the schema does not define, deep nesting, long repeated
fields and maps, every member of a ``oneof`` (or none), and out-of-range
``Timestamp``/``Duration`` values. A field type the builder does not know raises
:class:`UnsupportedField`: a new kind of field must get a strategy, not be skipped.

``overrides`` maps a field's full name (``package.Message.field``) or its plain name to a
strategy for one element of it; the fuzz tests use it to keep names away from what a
counted client uses.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    MethodDescriptor,
    ServiceDescriptor,
)
from google.protobuf.message import Message
from hypothesis import strategies as st

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
# Huge strings are drawn rarely (their cost is in the network, not in Hypothesis).
LONG_LENGTHS = (4096, 65_536, 1_000_000)
MAX_DEPTH = 4
MAX_REPEATED = 8
MAX_REPEATED_LONG = 300

Overrides = Mapping[str, st.SearchStrategy[Any]]


class UnsupportedField(TypeError):
    """A field type the builder has no strategy for."""


def _ints(bounds: tuple[int, int]) -> st.SearchStrategy[int]:
    low, high = bounds
    edges = sorted(e for e in {low, high, 0, 1, -1, 2**31 - 1, -(2**31)} if low <= e <= high)
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _rarely(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``rare`` about one draw in 32: huge values cost bandwidth, not search power."""
    return st.integers(0, 31).flatmap(lambda roll: rare if roll == 0 else common)


def text_values(*, huge: bool = True) -> st.SearchStrategy[str]:
    """Strings as a hostile peer sends them: empty, short unicode (NUL and RTL marks
    included), a few ASCII identifiers, and (unless ``huge`` is false) rarely very long."""
    common = st.one_of(
        st.just(""),
        st.text(max_size=40),
        st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True),
        st.sampled_from(["\x00", "\u202e", "../..", "%s%n", "${x}", "{{ 1 }}", " "]),
    )
    if not huge:
        return common
    long = st.one_of(
        st.builds(lambda n, c: c * n, st.sampled_from(LONG_LENGTHS[:2]), st.sampled_from("xé✓")),
        st.just("x" * LONG_LENGTHS[-1]),
    )
    return _rarely(common, long)


def bytes_values(*, huge: bool = True) -> st.SearchStrategy[bytes]:
    common = st.one_of(st.just(b""), st.binary(max_size=64))
    if not huge:
        return common
    return _rarely(common, st.builds(lambda n: b"\xff" * n, st.sampled_from(LONG_LENGTHS)))


def _floats(width: int) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([0.0, -0.0, float("nan"), float("inf"), float("-inf")]),
        st.floats(width=width),  # type: ignore[arg-type]
    )


SCALARS: dict[int, Callable[[], st.SearchStrategy[Any]]] = {
    FieldDescriptor.TYPE_INT32: lambda: _ints(INT32),
    FieldDescriptor.TYPE_SINT32: lambda: _ints(INT32),
    FieldDescriptor.TYPE_SFIXED32: lambda: _ints(INT32),
    FieldDescriptor.TYPE_INT64: lambda: _ints(INT64),
    FieldDescriptor.TYPE_SINT64: lambda: _ints(INT64),
    FieldDescriptor.TYPE_SFIXED64: lambda: _ints(INT64),
    FieldDescriptor.TYPE_UINT32: lambda: _ints(UINT32),
    FieldDescriptor.TYPE_FIXED32: lambda: _ints(UINT32),
    FieldDescriptor.TYPE_UINT64: lambda: _ints(UINT64),
    FieldDescriptor.TYPE_FIXED64: lambda: _ints(UINT64),
    FieldDescriptor.TYPE_DOUBLE: lambda: _floats(64),
    FieldDescriptor.TYPE_FLOAT: lambda: _floats(32),
    FieldDescriptor.TYPE_BOOL: st.booleans,
}


def _well_known(descriptor: Descriptor) -> st.SearchStrategy[dict[str, Any]] | None:
    """Timestamp and Duration: mostly valid values, sometimes out of their ranges (the
    wire allows any int64 seconds and int32 nanos)."""
    if descriptor.full_name == "google.protobuf.Timestamp":
        valid = st.fixed_dictionaries(
            {"seconds": st.integers(-62_135_596_800, 253_402_300_799),
             "nanos": st.integers(0, 999_999_999)}
        )  # fmt: skip
    elif descriptor.full_name == "google.protobuf.Duration":
        valid = st.fixed_dictionaries(
            {"seconds": st.one_of(st.integers(-10, 120), st.integers(-315_576_000_000,
                                                                      315_576_000_000)),
             "nanos": st.integers(0, 999_999_999)}
        )  # fmt: skip
    else:
        return None
    invalid = st.fixed_dictionaries({"seconds": _ints(INT64), "nanos": _ints(INT32)})
    return st.one_of(valid, valid, invalid)


@dataclass(frozen=True)
class _Builder:
    overrides: Overrides
    huge: bool = True

    def small(self) -> _Builder:
        """The same builder without huge strings: for the elements of long lists and maps,
        which would otherwise make messages far over gRPC's limit."""
        return _Builder(self.overrides, huge=False)

    def element(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        """One value of ``field`` (one element if it is repeated), as a Python value or, for
        message fields, a dict of field values that :func:`_fill` applies."""
        for key in (field.full_name, field.name):
            if key in self.overrides:
                return self.overrides[key]
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            return self.fields_of(_message_type(field), depth + 1)
        if field.type == FieldDescriptor.TYPE_ENUM:
            known = [value.number for value in _enum_type(field).values]
            return st.one_of(st.sampled_from(known), _ints(INT32))  # unknown numbers too
        if field.type == FieldDescriptor.TYPE_STRING:
            return text_values(huge=self.huge)
        if field.type == FieldDescriptor.TYPE_BYTES:
            return bytes_values(huge=self.huge)
        if field.type in SCALARS:
            return SCALARS[field.type]()
        raise UnsupportedField(f"{field.full_name}: field type {field.type} has no strategy")

    def value(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        """The whole value of ``field``: a list for repeated fields, a dict for maps."""
        if (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and _message_type(field).GetOptions().map_entry
        ):
            entry = _message_type(field)
            return st.dictionaries(
                self.small().element(entry.fields_by_name["key"], depth),
                self.small().element(entry.fields_by_name["value"], depth),
                max_size=MAX_REPEATED,
            )
        if field.is_repeated:
            short = st.lists(self.element(field, depth), max_size=MAX_REPEATED)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                return short
            many = self.small().element(field, depth)
            return _rarely(
                short, st.lists(many, min_size=MAX_REPEATED_LONG, max_size=MAX_REPEATED_LONG)
            )
        return self.element(field, depth)

    def fields_of(self, descriptor: Descriptor, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        """A dict of field name to value: each plain field present or not, at most one
        member of each oneof; below ``MAX_DEPTH`` nested messages are empty."""
        if (well_known := _well_known(descriptor)) is not None:
            return well_known
        if depth > MAX_DEPTH:
            return st.just({})
        in_oneof = {f.name for oneof in descriptor.oneofs for f in oneof.fields}
        optional = {
            f.name: st.one_of(st.just(_ABSENT), self.value(f, depth))
            for f in descriptor.fields
            if f.name not in in_oneof
        }
        oneofs = [
            st.one_of(
                st.just({}),
                *[
                    self.value(f, depth).map(functools.partial(_named, f.name))
                    for f in oneof.fields
                ],
            )
            for oneof in descriptor.oneofs
        ]
        return st.tuples(st.fixed_dictionaries(optional), *oneofs).map(_merge)


def _message_type(field: FieldDescriptor) -> Descriptor:
    """The message type of a message field (never None for one)."""
    assert field.message_type is not None, f"{field.full_name} is not a message field"
    return field.message_type


def _enum_type(field: FieldDescriptor) -> EnumDescriptor:
    """The enum type of an enum field (never None for one)."""
    assert field.enum_type is not None, f"{field.full_name} is not an enum field"
    return field.enum_type


def _named(name: str, value: Any) -> dict[str, Any]:
    """One oneof member's value as the dict :func:`_merge` takes."""
    return {name: value}


_ABSENT = object()


def _merge(parts: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    merged = {name: value for name, value in parts[0].items() if value is not _ABSENT}
    for chosen in parts[1:]:
        merged.update(chosen)
    return merged


def _fill(message: Message, values: Mapping[str, Any]) -> None:
    """Set ``values`` (from :meth:`_Builder.fields_of`) on ``message``."""
    descriptor = message.DESCRIPTOR
    for name, value in values.items():
        field = descriptor.fields_by_name[name]
        target = getattr(message, name)
        entry = field.message_type  # set for every message field, None for the others
        if field.type == FieldDescriptor.TYPE_MESSAGE and entry and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            for key, item in value.items():
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target[key], item)
                else:
                    target[key] = item
        elif field.is_repeated:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    _fill(target.add(), item)
            else:
                target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.SetInParent()
            _fill(target, value)
        else:
            setattr(message, name, value)


def message_strategy(
    descriptor: Descriptor, overrides: Overrides | None = None
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type, fields drawn as the module docstring says."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = _Builder(dict(overrides or {})).fields_of(descriptor, 0)

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        _fill(message, values)
        return message

    return fields.map(build)


def services(package: str = "dataservice") -> Iterator[ServiceDescriptor]:
    """Every gRPC service the generated ``*_pb2`` modules under ``package`` declare."""
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, f"{package}."):
        if module.name.endswith("_pb2"):
            file_descriptor = importlib.import_module(module.name).DESCRIPTOR
            yield from file_descriptor.services_by_name.values()


def methods(package: str = "dataservice") -> list[MethodDescriptor]:
    """Every RPC of every service, in a stable order."""
    found = [method for service in services(package) for method in service.methods]
    return sorted(found, key=lambda m: m.full_name)
