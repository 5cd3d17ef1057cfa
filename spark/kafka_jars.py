"""Spark's own Kafka source (``spark-sql-kafka-0-10``) from Maven Central, for comparisons.

The benchmark (``tests/bench/bench_spark.py``) runs the ``dataservice`` source and Spark's
Kafka source on the same topic in the same session. The jars are fetched with Maven from
``deploy/spark/pom.xml`` (the Spark version must equal the installed pyspark's) into
``~/.cache/dataservice/spark-kafka-<version>/jars`` once, like ``deploy/kafka`` does for the
broker; a marker holding the pom's hash makes an edited pom fetch again.

    python -m spark.kafka_jars      # fetch if needed, print the comma-separated jar list
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from services.devstack.cache import cache_dir, file_lock

POM = Path(__file__).resolve().parents[1] / "deploy" / "spark" / "pom.xml"
_MARKER = ".fetched"


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
    want = hashlib.sha256(POM.read_bytes()).hexdigest()
    if _fetched_hash(jars) != want:
        with file_lock(jars.parent / "fetch.lock"):
            if _fetched_hash(jars) != want:
                _fetch(jars)
                (jars / _MARKER).write_text(want + "\n")
    return sorted(jars.glob("*.jar"))


def _fetched_hash(jars: Path) -> str | None:
    try:
        return (jars / _MARKER).read_text().strip()
    except OSError:
        return None


def _fetch(jars: Path) -> None:
    partial = jars.with_name("jars.partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [
        "mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={partial}",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(partial.glob("spark-sql-kafka-*.jar")):
        raise RuntimeError(
            f"fetching spark-sql-kafka failed ({' '.join(argv)}), exit {result.returncode}:\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    shutil.rmtree(jars, ignore_errors=True)
    partial.rename(jars)


def main() -> int:
    print(",".join(str(p) for p in ensure_spark_kafka_jars()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
