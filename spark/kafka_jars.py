"""Spark's own Kafka source (``spark-sql-kafka-0-10``) from Maven Central, for comparisons.

The benchmark (``tests/bench/bench_spark.py``) runs the ``dataservice`` source and Spark's
Kafka source on the same topic in the same session. The jars are fetched with Maven from
``deploy/spark/pom.xml`` (the Spark version must equal the installed pyspark's) into
``~/.cache/dataservice/spark-kafka-<version>/jars`` once, like ``deploy/kafka`` does for the
broker; a marker holding the pom's hash makes an edited pom fetch again.

    python -m spark.kafka_jars      # fetch if needed, print the comma-separated jar list
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from services.devstack.cache import cache_dir, ensure_maven_jars

POM = Path(__file__).resolve().parents[1] / "deploy" / "spark" / "pom.xml"


def spark_version(pom: Path = POM) -> str:
    match = re.search(r"<spark\.version>\s*([^<\s]+)\s*</spark\.version>", pom.read_text())
    if match is None:
        raise RuntimeError(f"no <spark.version> property in {pom}")
    return match.group(1)


def _check_pyspark(version: str) -> None:
    import pyspark

    if pyspark.__version__ != version:
        raise RuntimeError(
            f"{POM} fetches Spark {version} but pyspark {pyspark.__version__} is installed: "
            "the Kafka source must match Spark's version exactly"
        )


def ensure_spark_kafka_jars() -> list[Path]:
    """The jars to put on ``spark.jars`` for ``format("kafka")``, fetched if needed."""
    version = spark_version()
    _check_pyspark(version)
    jars = cache_dir() / f"spark-kafka-{version}" / "jars"
    ensure_maven_jars(POM, jars, "spark-sql-kafka-*.jar", "spark-sql-kafka")
    return sorted(jars.glob("*.jar"))


def main() -> int:
    print(",".join(str(p) for p in ensure_spark_kafka_jars()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
