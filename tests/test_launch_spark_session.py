"""The checks made before a Spark launch: dynamic allocation (which barrier mode refuses) on a
real local-cluster, told before anything starts; the rule itself, pure."""

from __future__ import annotations

import pytest

from hvd_magic import HorovodRunner, LaunchError
from hvd_magic.launch.spark_session import dynamic_allocation_on

from .helpers import run_processes_anywhere
from .spark_fixtures import spark_session


@pytest.mark.parametrize(
    ("master", "enabled", "on"),
    [
        ("local-cluster[2,1,1024]", "true", True),
        ("spark://10.0.0.1:7077", "True ", True),
        ("yarn", "false", False),
        ("yarn", None, False),
        ("local[4]", "true", False),  # Spark ignores it in local mode
        ("local", "true", False),
    ],
)
def test_dynamic_allocation_as_spark_applies_it(master, enabled, on):
    assert dynamic_allocation_on(master, enabled) is on


@pytest.fixture(scope="module")
def dynamic():
    conf = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "1",
    }
    with spark_session("local-cluster[1,1,1024]", conf) as session:
        yield session


def test_dynamic_allocation_is_refused_before_launch_with_what_to_change(dynamic):
    # What Spark itself says of a barrier stage here, so the check mirrors a real refusal.
    with pytest.raises(Exception, match="dynamic resource allocation"):
        dynamic.sparkContext.parallelize(range(1), 1).barrier().mapPartitions(lambda rows: rows).collect()
    with pytest.raises(LaunchError) as info:
        HorovodRunner(np=1).run(lambda: 1)
    assert "spark.dynamicAllocation.enabled=false" in str(info.value)
    assert run_processes_anywhere() == []
