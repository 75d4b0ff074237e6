# sparkseg: `make demo` (inference only, no torch) and `make test` (everything) work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The main venv is installed without bytecode (pip --no-compile): compiling every module of every package took ~2 of
# its 3.5 min on 2 cores, torch's most of it. Python writes the bytecode of a module when it is first imported, so
# make's commands run without PYTHONDONTWRITEBYTECODE (container images often set it): with it, every process of the
# suites and jobs would compile again each module it imports.
unexport PYTHONDONTWRITEBYTECODE
BIGDL_VENV ?= .venv-bigdl
export PYSPARK_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1
# Each suite's temporary files in this checkout: pytest prunes old runs under the shared /tmp/pytest-of-<user>, which
# would delete the files of a suite still running from another checkout (two clones tested at once).
PYTEST_TMP := $(CURDIR)/.pytest-tmp
# The suites' other temporary files (Python's tempfile, Spark's local dirs, Chromium's profile, staged models, the
# driver JVMs' own temp files: Java does not read TMPDIR) in one directory per checkout, emptied when `make test`
# starts and removed when it passes: a run leaves nothing in /tmp, where the files of killed JVMs and random test
# models would otherwise pile up run after run. A short path: some of them hold Unix sockets (108 bytes at most).
SUITE_TMP := $(or $(TMPDIR),/tmp)/sparkseg-tests-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)
SUITE_ENV := TMPDIR="$(SUITE_TMP)" SPARK_LOCAL_DIRS="$(SUITE_TMP)" SPARK_SUBMIT_OPTS="-Djava.io.tmpdir='$(SUITE_TMP)'"

# The Spark driver JVM's class-data-sharing archive, once per env (~1 min;
# pipelines/tools/jvm_class_archive_build.py): every JVM
# a job starts maps it (~2x faster start-up on 2 cores, reports/startup.md).
.PHONY: jvm-archive
jvm-archive: $(VENV)/.stamp-infer
	@$(PY) -m pipelines.tools.jvm_class_archive_build --if-missing --quiet 2> $(VENV)/jvm-archive.log \
	    || { cat $(VENV)/jvm-archive.log; exit 1; }   # its job's own lines: in the log (shown if it fails)

.PHONY: demo test test-main test-bigdl test-databricks bench sweep bigdl-env databricks-env client-env azurite browser clean-venv \
	env-archive bigdl-env-archive

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"

# An editable install writes sparkseg.egg-info/ in this checkout: `make test` builds the BigDL env (which installs
# this checkout editable too) while it installs the main venv, so the installs take turns (scripts/env_lib.sh).
EDITABLE_INSTALL_LOCK := scripts/editable_install_lock.sh

# Inference only: pyspark, openvino, numpy, numba, pillow, pyarrow, pandas, pycocotools, zlib-ng; matplotlib for the
# report. No torch.
$(VENV)/.stamp-infer: setup.py constraints.txt | $(PY)
	$(EDITABLE_INSTALL_LOCK) $(PIP) install --no-compile -c constraints.txt -e ".[report]"
	touch $@

# Everything the tests need: export (torch, onnx, onnxruntime), azure, dev tools.
$(VENV)/.stamp-test: setup.py constraints.txt | $(PY)
	$(EDITABLE_INSTALL_LOCK) $(PIP) install --no-compile -c constraints.txt -e ".[export,train,sweep,azure,dev]"
	touch $@ $(VENV)/.stamp-infer

# The bundled road-distress model on SYNTHETIC road images like those it was trained on (generated once; the first
# two are samples/images/synthetic_road_*.jpg), evaluated against the generator's exact masks; ends with the report.
DEMO_DATA := work/demo/roads
demo: $(VENV)/.stamp-infer jvm-archive $(DEMO_DATA)/annotations.json
	$(PY) jobs/infer_yolact.py --config conf/demo.yaml
	$(PY) -m pipelines.report.evaluate --output output/demo --annotations $(DEMO_DATA)/annotations.json \
	    --group blobs=pothole,patch,puddle

$(DEMO_DATA)/annotations.json: | $(VENV)/.stamp-infer
	$(PY) -m pipelines.datasets.synthetic_roads --out $(DEMO_DATA) --count 8 --seed 90210 --size 640x480 --format coco

azurite:
	scripts/install_azurite.sh

# Headless Chromium + chromedriver (Debian packages) for the report page test; a no-op when installed.
browser:
	scripts/install_chromium.sh

bigdl-env:
	scripts/make_bigdl_env.sh $(BIGDL_VENV)

# A Databricks notebook job's libraries: Databricks Runtime 17.3 LTS's numpy, pandas, pyarrow, Pillow, matplotlib,
# Spark and Spark Connect client, plus what the notebook installs (notebooks/databricks_requirements.txt;
# scripts/make_databricks_env.sh)
DATABRICKS_VENV ?= .venv-databricks
databricks-env:
	scripts/make_databricks_env.sh $(DATABRICKS_VENV)

# A Spark Connect client: pyspark-client (no JVM, no py4j) and the driver's other libraries (scripts/make_client_env.sh);
# tests/test_connect_session.py runs the job from it against a Connect server.
CLIENT_VENV ?= .venv-client
client-env:
	scripts/make_client_env.sh $(CLIENT_VENV)

# Relocatable envs for `spark-submit --archives dist/<archive>#environment` (docs/deploy.md).
env-archive: $(VENV)/.stamp-infer   # the inference env (make demo's) and venv-pack: no torch needed to pack
	$(PY) -c 'import venv_pack' 2>/dev/null || $(PIP) install -c constraints.txt venv-pack
	PYTHON=$(PYTHON) PACKER_PYTHON=$(abspath $(PY)) scripts/build_env_archive.sh

bigdl-env-archive: $(VENV)/.stamp-test
	PACKER_PYTHON=$(abspath $(PY)) scripts/build_env_archive.sh --from-venv $(BIGDL_VENV) \
	    --output dist/sparkseg-bigdl-env.tar.gz

# Free space (GB) `make test` needs, checked before it starts: the envs it has yet to build (.venv ~7.5 GB with
# torch's CUDA libraries, the BigDL and Databricks envs ~1.3 GB each, plus pip's downloads) and its suites' peak in
# the checkout (.pytest-tmp/, dist/, build/: 3.4 GB) and in SUITE_TMP (1.7 GB), measured on a fresh clone
# (DEVELOPERS.md, "Disk").
ENVS_GB := $(if $(wildcard $(VENV)/.stamp-test),0,9) $(if $(wildcard $(BIGDL_VENV)/bin/python),0,2) \
	$(if $(wildcard $(DATABRICKS_VENV)/bin/python),0,2) $(if $(wildcard $(CLIENT_VENV)/bin/python),0,1)
CHECKOUT_PEAK_GB := 4
SUITE_TMP_PEAK_GB := 2
.PHONY: disk-space
disk-space:
	@scripts/check_free_space.sh "make test" "$(CURDIR)" $$(( $(CHECKOUT_PEAK_GB) $(patsubst %,+ %,$(ENVS_GB)) )) \
	    "$(SUITE_TMP)" $(SUITE_TMP_PEAK_GB)

# What the suites need, on both cores before they start, not later beside the suites, where all cores are busy: the
# main venv and then its JVM class archive on one (~1.5 + 1.5 min on 2 cores), the Databricks and BigDL envs (~1 min
# each) and Azurite on the other. The other core's output is printed after the main venv's.
SIDE_ENVS_LOG := $(PYTEST_TMP)/side-envs.log
.PHONY: test-envs
test-envs: disk-space
	@mkdir -p "$(PYTEST_TMP)"; status=0; \
	$(MAKE) --no-print-directory databricks-env bigdl-env client-env azurite > "$(SIDE_ENVS_LOG)" 2>&1 & side=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.stamp-test jvm-archive || status=1; \
	wait $$side || status=1; \
	cat "$(SIDE_ENVS_LOG)"; \
	exit $$status

# All suites always run (a failure in one does not hide another); make fails at the end if any did. The BigDL suite,
# then the Databricks one, run beside the main one, their output kept in logs and printed after the main suite's: all
# mostly wait on the JVMs and jobs they start (side by side: ~4 min off the whole run for the BigDL suite). The envs
# and Azurite come first (test-envs): the BigDL suite exports a model with the main venv; two suites use Azurite.
BIGDL_SUITE_LOG := $(PYTEST_TMP)/bigdl-suite.log
DATABRICKS_SUITE_LOG := $(PYTEST_TMP)/databricks-suite.log
test: test-envs
	@mkdir -p "$(PYTEST_TMP)"; rm -rf "$(SUITE_TMP)"; mkdir -p "$(SUITE_TMP)"; status=0; \
	{ side=0; $(MAKE) --no-print-directory test-bigdl > "$(BIGDL_SUITE_LOG)" 2>&1 || side=1; \
	  $(MAKE) --no-print-directory test-databricks > "$(DATABRICKS_SUITE_LOG)" 2>&1 || side=1; exit $$side; } & \
	beside=$$!; \
	$(MAKE) --no-print-directory test-main || status=1; \
	wait $$beside || status=1; \
	echo "---- the BigDL suite (make test-bigdl), run beside the main one: $(BIGDL_SUITE_LOG)"; \
	cat "$(BIGDL_SUITE_LOG)"; \
	echo "---- the Databricks suite (make test-databricks), run beside the main one: $(DATABRICKS_SUITE_LOG)"; \
	cat "$(DATABRICKS_SUITE_LOG)"; \
	if [ $$status -ne 0 ]; then echo "make test: FAILED (see the suites above)"; else rm -rf "$(SUITE_TMP)"; fi; \
	exit $$status

# The main suite in TEST_WORKERS processes (pytest-xdist), one test file per process at a time (--dist loadfile: a
# file's module fixtures are built once), the longest files first (tests/conftest.py's LONG_FILES_FIRST; without
# --no-loadscope-reorder xdist would order files by their number of tests). Its tests wait on processes they start
# (JVMs, clusters, jobs) much of the time: 2 workers on 2 cores took it from ~28 to ~21 min. 3 do not pay: `make
# test` one after the other on a 2-core EPYC Zen 5, 738 s and 1434 busy CPU-s with 2 workers, 783 s and 1554 with 3.
# A worker that crashes (a segfault) fails its file and the run (--max-worker-restart=0): xdist's replacement worker
# would hang the run, both sides waiting, until CI's time limit.
TEST_WORKERS ?= 2
test-main: $(VENV)/.stamp-test azurite browser jvm-archive client-env
	mkdir -p "$(PYTEST_TMP)" "$(SUITE_TMP)"
	$(SUITE_ENV) $(PY) -m pytest -m "not bigdl" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--max-worker-restart=0 --durations=25 --basetemp="$(PYTEST_TMP)/main" tests

test-bigdl: bigdl-env
	mkdir -p "$(PYTEST_TMP)" "$(SUITE_TMP)"
	$(SUITE_ENV) PYSPARK_PYTHON=$(abspath $(BIGDL_VENV))/bin/python $(BIGDL_VENV)/bin/python -m pytest -m bigdl --durations=25 --basetemp="$(PYTEST_TMP)/bigdl" \
		tests/test_bigdl_engine.py tests/test_bigdl_job.py

# The inference path's tests in the Databricks env (databricks-env): the notebook (on a Spark Connect server of the
# env's pyspark, as on serverless, and on a classic session), decoding, the job, masks, video and the report, on the
# Runtime's older numpy, pandas, pyarrow, Pillow, matplotlib and Spark. A few minutes: the main suite runs them all
# with its own versions, and this one runs beside it on the same cores. Video: the broken
# files' test (decode, frames, error rows: 12 s), not the 300-frame stride test (72 s, the same code on more frames).
DATABRICKS_SUITE := tests/test_deploy_notebooks.py tests/test_image_decode.py tests/test_infer_job.py \
	tests/test_mask_outputs.py tests/test_box_local_masks.py \
	tests/test_video_input.py::test_truncated_empty_and_fake_videos_are_error_rows_and_readable_frames_are_kept \
	tests/test_render.py::test_overlay_paints_exactly_the_masks_pixels_higher_score_on_top \
	tests/test_render.py::test_failed_images_are_named_in_the_report_and_the_cli_summary
test-databricks: databricks-env azurite
	mkdir -p "$(PYTEST_TMP)" "$(SUITE_TMP)"
	$(SUITE_ENV) PYSPARK_PYTHON=$(abspath $(DATABRICKS_VENV))/bin/python $(DATABRICKS_VENV)/bin/python -m pytest -m "not bigdl" \
		--durations=10 --basetemp="$(PYTEST_TMP)/databricks" $(DATABRICKS_SUITE)

# Lint, format and types, configured in pyproject.toml: ruff over the checkout, mypy over the packages it declares.
# All three run; make fails at the end if any did.
.PHONY: check test-fast
check: $(VENV)/.stamp-test
	@status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

# The loop to run while editing: the main venv's tests without the `slow` ones (tests/conftest.py's SLOW_FILES:
# standalone clusters, packed envs, Azurite, whole jobs and trainings in subprocesses, the browser) nor the BigDL
# and Databricks suites. New test files are in it unless added there.
test-fast: $(VENV)/.stamp-test jvm-archive
	mkdir -p "$(PYTEST_TMP)" "$(SUITE_TMP)"
	$(SUITE_ENV) $(PY) -m pytest -m "not slow and not cluster and not bigdl" -n $(TEST_WORKERS) --dist loadfile \
		--max-worker-restart=0 --durations=10 --basetemp="$(PYTEST_TMP)/fast" tests

bench: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench.py

# The job's executor function (P processes x 1 thread, masks written) vs benchmark_app (P streams x 1 thread), the
# previous per-image code beside the current one -> reports/executor.md, .json. Options: BENCH_EXECUTOR_ARGS="--r50
# --detector --int8 --processes 16 --precisions f32,bf16" (python scripts/bench_executor.py --help)
.PHONY: bench-executor
bench-executor: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_executor.py $(BENCH_EXECUTOR_ARGS)

# INT8 vs f32 (and bf16 where the CPU has it) with benchmark_app, detection agreement and mask AP of the bundled
# model -> reports/int8.md, .json (BENCH_INT8_ARGS="--seconds 30 --calibration-count 128")
.PHONY: bench-int8
bench-int8: $(VENV)/.stamp-test
	$(PY) scripts/bench_int8.py $(BENCH_INT8_ARGS)

# The job's own cost: first progress line and wall of `make demo`, overhead of a 200-image run, empty incremental
# runs after 100 earlier runs; with and without the JVM class archive -> reports/startup.md, .json
.PHONY: bench-startup
bench-startup: $(VENV)/.stamp-test jvm-archive $(DEMO_DATA)/annotations.json
	$(PY) scripts/bench_startup.py $(BENCH_STARTUP_ARGS)

# The job's planning without image files: synthetic listings and done tables of 10^5..10^7 rows, driver memory 1g,
# first and incremental runs -> reports/planning.md (BENCH_PLANNING_ARGS="--sizes 100000,1000000")
.PHONY: bench-planning
bench-planning: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_planning.py $(BENCH_PLANNING_ARGS)

# The report's gather (output.overlays): pyarrow (the render CLI) against Spark (the job) on synthetic outputs of
# 10^5..10^6 images: seconds, peak RSS -> reports/report_gather.md (BENCH_REPORT_ARGS="--sizes 100000")
.PHONY: bench-report
bench-report: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_report.py $(BENCH_REPORT_ARGS)

# Listing a local input: the executors' walk against Spark's file index, seconds and driver heap -> reports/listing.md
# (BENCH_LISTING_ARGS="--files 100000 --directories 100")
.PHONY: bench-listing
bench-listing: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_listing.py $(BENCH_LISTING_ARGS)

# Streaming: --available-now against the batch job over a backlog, and a running stream's latency from a file's
# landing to its detections row -> reports/stream.md (BENCH_STREAM_ARGS="--images 1000 --interval 10")
.PHONY: bench-stream
bench-stream: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_stream.py $(BENCH_STREAM_ARGS)

# The job on a Spark Connect session (from the client env) against the classic session: fixed cost and throughput
.PHONY: bench-connect
bench-connect: $(VENV)/.stamp-test jvm-archive client-env
	$(PY) scripts/bench_connect.py $(BENCH_CONNECT_ARGS)

# Training: the strategies through the real job (make bench-training), the step on one device against its model-only
# ceiling (BENCH_TRAINING_ARGS="--device cuda"), the input workers' ms per image (make bench-loader)
.PHONY: bench-training bench-loader
bench-training: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench_training.py $(BENCH_TRAINING_ARGS)

bench-loader: $(VENV)/.stamp-test
	$(PY) scripts/bench_loader.py $(BENCH_LOADER_ARGS)

# partitions x executor cores on a 2-worker standalone cluster, 200 bench images -> reports/sweep-cluster/
sweep: $(VENV)/.stamp-test jvm-archive
	$(PY) scripts/bench/images.py work/bench/images-200 200
	$(PY) jobs/sweep.py --config conf/sweep_cluster.yaml

clean-venv:
	rm -rf $(VENV) $(BIGDL_VENV)
