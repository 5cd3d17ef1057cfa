"""The Spark side of the mesh (ARCHITECTURE §7): the ``dataservice`` source and the jobs."""
