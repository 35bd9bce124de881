"""The investigation on Apache Spark: the DuckDB path's ingest and analysis, by file and by node.

:func:`investigate` runs the whole of it (logs to a Parquet case that ``forensics.Case``, the
query commands and the report open as they open a DuckDB case); :func:`analyse` the analysis of
records already in Spark. How the work partitions and what it costs: docs/fleet.md.

Needs the ``spark`` extra (``pip install 'kvforensics[spark]'``) and Java 17 or later. Local mode
(``local[N]``) runs on this machine; a cluster is named by its master URL (the logs and the
output folder on storage its executors and the driver all see).
"""

from forensics.spark.analysis import COLUMNS, SparkResult, analyse, analyse_case, records_of_case, spark_session
from forensics.spark.job import SparkInvestigation, investigate

__all__ = ["COLUMNS", "SparkInvestigation", "SparkResult", "analyse", "analyse_case", "investigate",
           "records_of_case", "spark_session"]
