"""sparkseg: YOLACT instance segmentation and object detection on Spark CPU clusters."""

from pathlib import Path

from setuptools import find_packages, setup

# numpy, pillow, pyarrow, pandas, matplotlib (the extras) and the Spark Connect client's libraries: the oldest versions
# tested, Databricks Runtime 17.3 LTS's (make test-databricks) or the BigDL env's where older (numpy 1.26, pyspark 3.5:
# make test-bigdl). A wheel asking for newer ones would replace the Runtime's on install.
CORE = [
    "pyspark>=3.5,<5",
    "openvino>=2023.3",
    "numpy>=1.26.4",
    "pillow>=11.1",
    "pyarrow>=19",
    "pandas>=2.2.3,<3",
    "pyyaml>=6",
    "pycocotools>=2.0.7",
    "zlib-ng>=0.5",  # label-map PNGs deflated ~4x faster than by zlib (pipelines.ops.mask_outputs)
    "numba>=0.60",  # the per-pixel loops of resize, masks and label maps (pipelines.ops.compiled_loops)
    "fsspec>=2023.1",
    # PyAV (FFmpeg bundled in its wheels): video input, decoded on the executors (pipelines.ops.video_decode)
    "av>=12,<19",
]
CONNECT = ["grpcio>=1.67", "grpcio-status>=1.67", "googleapis-common-protos>=1.65", "zstandard>=0.25"]
AZURE = ["adlfs>=2024.4", "azure-storage-blob>=12.19", "azure-identity>=1.15"]
# A Spark Connect client env (make client-env): Spark's JVM-less client package instead of pyspark, the rest of CORE,
# the Connect client's libraries and the Azure SDK path (the only remote store a Connect driver writes itself).
CLIENT = ["pyspark-client>=4.0,<5", *(r for r in CORE if not r.startswith("pyspark")), *CONNECT, *AZURE]
# 2.6: nonzero_static on CUDA (the training matching), fused SGD/AdamW on CPUs
TORCH = ["torch>=2.6", "torchvision>=0.21"]
EXTRAS = {
    # PyTorch -> ONNX -> simplified ONNX -> OpenVINO IR, and the parity report.
    "export": TORCH + ["onnx>=1.16", "onnxruntime>=1.18", "onnxslim>=0.1.40", "nncf>=3.0,<4"],
    # Distributed training (TorchDistributor), runs tracking and plots.
    "train": TORCH + ["mlflow>=2.10", "matplotlib>=3.10", "tqdm>=4.66"],
    # Azure SDK read/write path for clusters without hadoop-azure.
    "azure": AZURE,
    # The BigDL engine's own env. The BigDL 2.4 wheels themselves pin pyspark 3.1 and must be installed with
    # --no-deps on top of this extra: `make bigdl-env` does both (see Makefile and DEVELOPERS.md).
    "bigdl": [
        "pyspark>=3.5,<3.6",
        "numpy<2",
        "pyarrow<20",
        "openvino==2023.3.0",
        "six",
        "conda-pack==0.3.1",
        "pyzmq",
        "packaging",
        "filelock",
    ],
    # Models from an MLflow registry (--model models:/NAME/VERSION, export --register-as): pipelines.io.model_registry.
    "mlflow": ["mlflow>=2.10"],
    # Spark Connect clients (--remote sc://host:port, SPARK_REMOTE; pipelines.spark.session_kind): what pyspark's own
    # `connect` extra adds to the core (pandas, pyarrow and numpy are there already).
    "connect": CONNECT,
    # The run report (python -m pipelines.report.render): per-class count and score plots. make demo installs it.
    "report": ["matplotlib>=3.10"],
    # Sweeps and benchmarks (jobs/sweep.py, make bench): process memory sampling and plots.
    "sweep": ["psutil>=5.9", "matplotlib>=3.10"],
    "dev": CONNECT
    + [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.8",
        "matplotlib>=3.10",
        "venv-pack>=0.2",
        "psutil>=5.9",
        "selenium>=4.20,<5",
        # make check: ruff's formatting changes between minor versions, so the range stays within one
        "ruff>=0.17.6,<0.18",
        "mypy>=2.4,<3",
        "types-PyYAML>=6",
    ],  # selenium drives Debian's chromium (make browser) in the report page test
}

if __name__ == "__main__":  # setuptools runs this file as __main__; scripts/make_client_env.sh imports its lists
    setup(
        name="sparkseg",
        version="0.1.0",
        description=__doc__,
        long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
        long_description_content_type="text/markdown",
        license="MIT",
        python_requires=">=3.10",
        packages=find_packages(include=["pipelines", "pipelines.*", "model_export", "model_export.*"])
        + ["pipelines.conf"],
        # conf/ (the deployment YAMLs, conf/local.yaml the jobs' defaults) installs as pipelines/conf/: an installed
        # wheel or a packed env reads the same defaults as a checkout (pipelines.job_config.default_config_path).
        package_dir={"pipelines.conf": "conf"},
        package_data={
            "pipelines.conf": ["*.yaml", "*.properties"],
            # a top-level module on local workers' path, not a package (spark_session.local_daemon_settings)
            "pipelines.spark": ["local_daemon/*.py"],
        },
        install_requires=CORE,
        extras_require=EXTRAS,
        entry_points={
            "console_scripts": [
                "sparkseg-infer-yolact = pipelines.job_cli:main_yolact",
                "sparkseg-infer-detector = pipelines.job_cli:main_detector",
            ]
        },
    )
