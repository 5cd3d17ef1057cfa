"""Commit metadata: who committed (lease epoch, sidecar) and what was acked above it.

The committed offset is the lowest un-acked offset, so records acked *above* a gap would be
delivered again after a crash. Each commit therefore also records those acked offsets, as
ranges relative to the committed offset, in the commit's metadata string; the next owner
skips them (ARCHITECTURE §3: redelivery is what was delivered and not acked). Kafka keeps
at most ``offset.metadata.max.bytes`` (4096 by default) of metadata: the ranges are
trimmed, lowest first kept, to fit; anything trimmed is merely redelivered. Pure code.

Shared: sidecars write it with every commit, and the assigner with the offsets it commits
for a reset (under the new lease epoch, nothing acked above); the next owner reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

METADATA_MAX_BYTES = 3800  # under Kafka's default offset.metadata.max.bytes (4096)
# The committer the assigner names in the commits of a reset through the mesh.
ASSIGNER = "assigner"


def lease_transactional_id(group: str, topic: str, partition: int) -> str:
    """The one ``transactional.id`` of a lease (commit_fencing: kafka, issue 36): every
    holder of (group, topic, partition) initialises it on its grant, and the assigner
    before it commits a reset, so each fences whoever committed under it before."""
    return f"ds-lease.{group}.{topic}.{partition}"


@dataclass(frozen=True)
class CommitMetadata:
    epoch: int
    sidecar: str
    acked: tuple[tuple[int, int], ...] = ()  # inclusive absolute offset ranges


def ranges_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets → inclusive ranges of consecutive offsets."""
    out: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if out and offset == out[-1][1] + 1:
            out[-1] = (out[-1][0], offset)
        else:
            out.append((offset, offset))
    return out


def encode(epoch: int, sidecar: str, committed: int, acked: Sequence[tuple[int, int]]) -> str:
    """JSON metadata; ranges as [start - committed, length], trimmed to fit the limit."""
    relative = [[start - committed, end - start + 1] for start, end in acked if start >= committed]
    while True:
        document: dict[str, object] = {"epoch": epoch, "sidecar": sidecar}
        if relative:
            document["acked"] = relative
        text = json.dumps(document, separators=(",", ":"))
        if len(text.encode()) <= METADATA_MAX_BYTES or not relative:
            return text
        relative = relative[: max(0, len(relative) * 3 // 4)]


def decode(metadata: str | None, committed: int) -> CommitMetadata | None:
    """Parse what :func:`encode` wrote; None for empty or foreign metadata. A trailing NUL
    is ignored: confluent-kafka hands librdkafka the C string with its terminator, so the
    commit log (``__consumer_offsets``) holds it, though OffsetFetch answers without it."""
    metadata = (metadata or "").rstrip("\x00")
    if not metadata:
        return None
    try:
        document = json.loads(metadata)
        epoch = int(document.get("epoch", 0))
        sidecar = str(document.get("sidecar", ""))
        acked = tuple(
            (committed + int(delta), committed + int(delta) + int(length) - 1)
            for delta, length in document.get("acked", [])
            if int(delta) >= 0 and int(length) > 0
        )
    except (ValueError, TypeError, AttributeError):
        return None
    return CommitMetadata(epoch, sidecar, acked)


def expand(ranges: Iterable[tuple[int, int]]) -> set[int]:
    return {offset for start, end in ranges for offset in range(start, end + 1)}


def is_external(committed: int, metadata: str | None, last_seen: int) -> bool:
    """Whether a partition's committed offset, found in Kafka by its holder, was written
    outside the mesh (an offset reset with Kafka's own tools, issue 23).

    ``last_seen`` is the holder's history: the offset it last committed, or found committed
    when it started (-1 = none). An offset equal to it changed nothing, whoever wrote it.
    Any other offset is the mesh's own when its metadata names a committer — this holder
    under any epoch, another sidecar (a late commit of a previous holder, a kafka_group
    member's epoch 0) or the assigner (a reset through the mesh) — since every commit the
    mesh makes carries :func:`encode`'s metadata; anything else (empty metadata, as
    ``kafka-consumer-groups --reset-offsets`` writes, or foreign text) is external.
    Nothing committed (-1) is never external."""
    if committed < 0 or committed == last_seen:
        return False
    meta = decode(metadata, committed)
    return meta is None or not meta.sidecar


def describe_writer(metadata: str | None) -> str:
    """What an external commit's metadata says about its writer, for the audit record."""
    if not metadata:
        return "no commit metadata (Kafka's tools write none)"
    return f"commit metadata {metadata[:200]!r}"


def committed_by(metadata: str | None, committed: int) -> str:
    """Who wrote a partition's last commit, from its metadata, for ``dsctl describe`` and
    ``/ui`` (issue 23): a sidecar under its lease epoch, a reset through the mesh (the
    assigner), or an external writer such as ``kafka-consumer-groups``. "" = no commit."""
    if committed < 0:
        return ""
    meta = decode(metadata, committed)
    if meta is None or not meta.sidecar:
        text = (metadata or "").rstrip("\x00")
        return f"external (metadata {text[:60]!r})" if text else "external (no metadata)"
    if meta.sidecar == ASSIGNER:
        return f"reset through the mesh (epoch {meta.epoch})"
    return f"{meta.sidecar} (epoch {meta.epoch})"
