# Sourced by Spark's scripts for every JVM they start (tests/conftest.py sets SPARK_CONF_DIR):
# the standalone masters and workers of the tests get the JIT and collector of spark-defaults.conf.
SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
