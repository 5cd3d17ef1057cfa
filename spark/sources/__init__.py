"""The ``dataservice`` PySpark Python Data Source (``spark.sources.dataservice``)."""

from spark.sources.dataservice import DataserviceDataSource

__all__ = ["DataserviceDataSource"]
