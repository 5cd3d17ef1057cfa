"""Options of the dataservice source: defaults, validation, the schema they imply."""

from __future__ import annotations

import pytest

from spark.sources.options import OptionError, parse_options, schema_ddl


def test_defaults() -> None:
    o = parse_options({"group": "g"})
    assert o.assigners == ("127.0.0.1:7070",) and o.consul is None
    assert o.starting_offsets is None and o.ending_offsets == "latest"
    assert o.max_records_per_trigger is None and o.commit_offsets and o.fail_on_data_loss
    assert o.client_id == "spark-g"
    assert schema_ddl(o) == (
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    )


def test_spark_lower_cases_option_names() -> None:
    o = parse_options(
        {
            "group": "g",
            "assigner": "a:1,b:2",
            "topics": "y, x,x",
            "startingoffsets": '{"x": {"0": 5}}',
            "maxrecordspertrigger": "100",
            "valueformat": "JSON",
            "valueschema": "id BIGINT, ts TIMESTAMP",
            "keyformat": "utf8",
            "includeheaders": "true",
            "commitoffsets": "false",
            "pollintervalms": "250",
        }
    )
    assert o.assigners == ("a:1", "b:2") and o.topics == ("x", "y")
    assert o.starting_offsets == '{"x": {"0": 5}}' and o.max_records_per_trigger == 100
    assert o.poll_interval_seconds == 0.25 and not o.commit_offsets
    assert schema_ddl(o) == (
        "key string, value struct<id BIGINT, ts TIMESTAMP>, topic string, partition int, "
        "offset bigint, timestamp timestamp, headers array<struct<key: string, value: binary>>"
    )


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({}, "group"),
        ({"group": "g", "assigner": "nohost"}, "assigner"),
        ({"group": "g", "startingoffsets": "yesterday"}, "startingOffsets"),
        ({"group": "g", "endingoffsets": "committed"}, "endingOffsets"),
        ({"group": "g", "maxrecordspertrigger": "0"}, "maxRecordsPerTrigger"),
        ({"group": "g", "maxrecordspertrigger": "many"}, "maxRecordsPerTrigger"),
        ({"group": "g", "valueformat": "avro"}, "valueFormat"),
        ({"group": "g", "valueformat": "json"}, "valueSchema"),
        ({"group": "g", "valueformat": "json", "valueschema": "{}"}, "valueSchema"),
        ({"group": "g", "valueschema": "id INT"}, "valueSchema"),
        ({"group": "g", "commitoffsets": "maybe"}, "commitOffsets"),
        ({"group": "g", "chunkbytes": str(65 * 1024 * 1024)}, "chunkBytes"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], names: str) -> None:
    with pytest.raises(OptionError, match=f"option {names}"):
        parse_options(options)
