# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
PY := .venv/bin/python
# mypy keeps its cache in the clone (.mypy_cache), never shared: a cache shared by every clone on the
# machine let CI's fresh clone crash mypy 2.4.1 (INTERNAL ERROR) on state another checkout left. A
# fresh clone starts from a copy of the last clean check's (scripts/mypy_check.py: 6 to 7 CPU-s instead
# of a cold check's 23) and checks cold where mypy crashes on it.

# How `make test` runs pytest: three workers on two cores (the ranks' waits leave one idle
# otherwise), tests/scheduling.py's groups (a module, an example notebook, the modules that share
# a Spark cluster) longest first. scripts/coverage.sh runs the suite the same way.
PYTEST_ARGS := -ra -n 3 --dist loadscope --no-loadscope-reorder

# Where a machine sets PYTHONDONTWRITEBYTECODE (this one does), what make runs still keeps the
# bytecode it compiles in the clone's own venv, as Python does elsewhere: each module compiled
# once, on its first import, instead of all 22,000 at install or every import anew
# (scripts/bytecode.py makes what Python cannot write itself). After pytest, the venv's bytecode is
# kept for the next fresh venv of the same pins, as Horovod's wheel is (scripts/bytecode.py).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test lint docs bench js-test pytest-args

# (SETUP_DONE=1: a step of `make test`, which set up already)
setup:
	@[ -n "$(SETUP_DONE)" ] || bash scripts/setup.sh

demo: setup
	$(PY) scripts/run_notebook.py example_notebooks/mnist_pytorch.ipynb --html example_notebooks/mnist_pytorch.html

lint: setup
	$(PY) -m ruff check setup.py hvd_magic tests scripts bench example_notebooks
	$(PY) -m ruff format --check setup.py hvd_magic tests scripts bench example_notebooks
	$(PY) scripts/mypy_check.py

# the guide in docs/ (Sphinx + MyST), warnings as errors: docs/_build/html/index.html
docs: setup
	$(PY) -m sphinx -W --keep-going -n -b html docs docs/_build/html

# Set-up makes the suite's Spark class archive beside its own steps (--tests; tests/spark_jvm.py:
# made once per environment, 30 s of a JVM mostly waiting). Before pytest, side by side on the
# two cores: ruff and mypy (from the cache of the last clean check: scripts/mypy_check.py), the
# docs and the viewer's vitest tests.
test:
	@bash scripts/setup.sh --tests
	$(MAKE) --no-print-directory -j 3 --output-sync=target SETUP_DONE=1 lint docs js-test
	$(PY) -m pytest $(PYTEST_ARGS) --durations=25
	@$(PY) scripts/bytecode.py --keep

pytest-args:
	@echo $(PYTEST_ARGS)

js-test: setup
	cd js && npx vitest run
	cd labextension && npx tsc --noEmit && npx vitest run

bench: setup
	$(PY) bench/launch.py
	$(PY) bench/spark_phases.py --repeat 9
	$(PY) bench/spark_phases.py --launcher mpi --repeat 9
	$(PY) bench/live_view.py
	$(PY) bench/panel_cost.py
	$(PY) bench/timeline_parse.py
	$(PY) bench/stop.py
	$(PY) bench/data_plane.py
	$(PY) bench/idle_ranks.py
	$(PY) bench/idle_ranks.py --spark
	$(PY) bench/connect_launch.py
	$(PY) bench/estimator.py
	$(PY) bench/doctor.py
	$(PY) bench/session.py --spark
	$(PY) bench/recovery.py
	$(PY) bench/resize.py
	$(PY) bench/telemetry.py
	$(PY) bench/stragglers.py
	$(PY) bench/trainers.py
	$(PY) bench/warm_ranks.py
	$(PY) bench/warm_ranks.py --spark "local-cluster[2,1,1024]"
	$(PY) bench/warm_ranks.py --framework keras
	$(PY) bench/warm_ranks.py --framework none
	$(PY) bench/launch_hosts.py --repeat 3
	$(PY) bench/figures.py   # the figures just kept (bench/figures.json) into the docs' marks
