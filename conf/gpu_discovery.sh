#!/usr/bin/env bash
# Spark GPU discovery script (spark.driver.resource.gpu.discoveryScript / spark.executor.resource.gpu.discoveryScript):
# prints the GPUs of this machine as Spark expects, e.g. {"name": "gpu", "addresses": ["0","1"]}.
# Needs nvidia-smi on the PATH. The same as Spark's examples/src/main/scripts/getGpusResources.sh.
ADDRS=$(nvidia-smi --query-gpu=index --format=csv,noheader | sed -e ':a' -e 'N' -e '$!ba' -e 's/\n/","/g')
echo "{\"name\": \"gpu\", \"addresses\": [\"$ADDRS\"]}"
