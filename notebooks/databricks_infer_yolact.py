# Databricks notebook source
# MAGIC %md
# MAGIC # sparkseg: YOLACT inference (Databricks job)
# MAGIC
# MAGIC Runs the same library as `spark-submit jobs/infer_yolact.py`: `pipelines.inference.inference_job.run(spark,
# MAGIC config)`, on serverless compute, standard access mode or a classic (dedicated) cluster alike: the library
# MAGIC picks its Spark Connect or classic path from the session it is given.
# MAGIC Images in (a Unity Catalog volume `/Volumes/<catalog>/<schema>/<volume>/...`, or `az://container/prefix` through
# MAGIC the Azure SDK), detections, masks, errors and `summary.json` out, to a volume or `az://`; the model export in a
# MAGIC volume. Incremental: each run processes only images not yet done for this model (new or replaced since), and a
# MAGIC lock (`<output>/_sparkseg.lock`) keeps two runs on one output from overlapping. Widget `mode`: `batch` lists the
# MAGIC whole input; `available-now` is a stream that does what landed since its last run, then stops (its checkpoint
# MAGIC under the output; a volume or `abfss://` input; `stream.source: cloudFiles` in the config for Auto Loader).
# MAGIC
# MAGIC Parameters are widgets (a job's `base_parameters` set them). Azure credentials, for `az://` only, come from a
# MAGIC secret scope: give the scope and the NAMES of the secrets in it, never the secrets. The next cell installs what
# MAGIC the Runtime or serverless environment lacks (`databricks_requirements.txt` beside this notebook);
# MAGIC `notebooks/databricks_job.json` runs this notebook as a serverless job, `databricks_job_classic.json` on a job
# MAGIC cluster (docs/deploy.md, Databricks).

# COMMAND ----------

# MAGIC %pip install -r databricks_requirements.txt

# COMMAND ----------

dbutils.widgets.text("input", "/Volumes/main/sparkseg/images/landing", "Input (volume path or URI)")
dbutils.widgets.text("output", "/Volumes/main/sparkseg/results/yolact", "Output (volume path or URI)")
dbutils.widgets.text("model", "/Volumes/main/sparkseg/models/yolact_resnet50", "Model export dir or models:/ URI")
dbutils.widgets.dropdown("engine", "native", ["native", "bigdl"], "Engine")
dbutils.widgets.dropdown("precision", "auto", ["auto", "f32", "bf16"], "Precision")
dbutils.widgets.text("partitions", "0", "Partitions (0: cluster cores)")
dbutils.widgets.text("config", "conf/databricks.yaml", "Config (relative to the repo)")
dbutils.widgets.dropdown("break_lock", "false", ["false", "true"], "Break the output lock")
dbutils.widgets.dropdown("mode", "batch", ["batch", "available-now"], "batch, or a stream of what is new, then stop")
dbutils.widgets.text("secret_scope", "", "Secret scope for az:// ('' for none)")
dbutils.widgets.text("connection_string_key", "storage-connection-string", "Secret: connection string")
dbutils.widgets.text("account_key_key", "", "Secret: account key")
dbutils.widgets.text("sas_token_key", "", "Secret: SAS token")
dbutils.widgets.text("account_name", "", "Storage account (not a secret)")

# COMMAND ----------

# The repository (a Databricks Git folder, or a job's git_source checkout) holds `pipelines/`; notebooks run with
# their own folder as the working directory, so look upwards for it unless the package is installed.
import json
import os
import sys
from pathlib import Path


def find_repo_root(start: Path) -> Path:
    for folder in [start, *start.parents]:
        if (folder / "pipelines" / "__init__.py").is_file():
            return folder
    raise FileNotFoundError(
        f"no pipelines/ package above {start}: run this notebook from the sparkseg repository "
        "(a Git folder or the job's git_source)"
    )


REPO_ROOT = find_repo_root(Path(os.getcwd()).resolve())
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from pipelines.inference.inference_job import run  # noqa: E402
from pipelines.inference.stream_job import stream  # noqa: E402
from pipelines.io.azure_credentials import AzureCredentials  # noqa: E402
from pipelines.job_cli import choose_engine  # noqa: E402
from pipelines.job_config import ConfigError, JobConfig, load_config, set_path  # noqa: E402

# COMMAND ----------


def widget(name: str) -> str:
    return dbutils.widgets.get(name).strip()  # a value pasted with spaces around it


partitions = widget("partitions") or "0"
if not partitions.isdigit():
    raise ConfigError(
        f"widget partitions is {partitions!r}: give a whole number of tasks per wave (0: the cluster's cores)"
    )
config_path = Path(widget("config"))
config = load_config(config_path if config_path.is_absolute() else REPO_ROOT / config_path)
for key, value in {
    "input.uri": widget("input"),
    "output.uri": widget("output"),
    "model.dir": widget("model"),
    "inference.engine": widget("engine"),
    "inference.precision": widget("precision"),
    "inference.partitions": int(partitions),
}.items():
    set_path(config, key, value)
config["run"]["break_lock"] = widget("break_lock") == "true"
# available-now: a stream whose checkpoint (<output>/_sparkseg_stream) knows what it saw, so a scheduled run does
# not list the whole input; the only trigger serverless compute allows (stream.source: cloudFiles for Auto Loader)
available_now = widget("mode") == "available-now"
config.setdefault("stream", {})["available_now"] = available_now

scope = widget("secret_scope")
credentials = None
if scope:
    credentials = AzureCredentials.from_databricks_secrets(
        dbutils,
        scope,
        connection_string_key=widget("connection_string_key") or None,
        account_key_key=widget("account_key_key") or None,
        sas_token_key=widget("sas_token_key") or None,
        account_name=widget("account_name") or None,
    )
print(
    f"input {config['input']['uri']}\noutput {config['output']['uri']}\nmodel {config['model']['dir']}\n"
    f"engine {config['inference']['engine']}, credentials {credentials!r}"
)

# COMMAND ----------

engine = choose_engine(JobConfig.of(config).inference.engine)  # the engine widget's backend
summary = (stream if available_now else run)(spark, config, "yolact", azure_credentials=credentials, engine=engine)
if summary is None:  # an available-now run that found nothing new: nothing written
    dbutils.notebook.exit(json.dumps({"run_id": None, "output": config["output"]["uri"], "counts": None}))
counts = summary["counts"]
print(
    f"done {counts['done']}, failed {counts['failed']} (see errors/), skipped {counts['skipped']} "
    f"(already done), {summary['images_per_second']} images/s; output holds {summary['table']['images']} images "
    f"and {summary['table']['errors']} errors"
)
if summary["model"]["note"]:
    print("NOTE:", summary["model"]["note"])

# COMMAND ----------

dbutils.notebook.exit(
    json.dumps({"run_id": summary["run_id"], "output": summary["output"], "counts": counts, "table": summary["table"]})
)
