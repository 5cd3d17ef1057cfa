"""Spark jobs over the mesh: ``python -m spark.jobs.<name>`` or ``spark-submit``."""
