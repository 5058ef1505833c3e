#!/usr/bin/env bash
# Fetch, here, the wheels of servesim's dependencies that a lent GPU machine's image lacks, into ./.whl
# (git-ignored; name it in the lease call's `carry`). That image runs Python 3.12 with torch, numpy,
# pandas, scipy, pyyaml, typer, rich, narwhals and packaging, and reaches no package registry, so
# simpy, pydantic (with pydantic-core, annotated-types, typing-inspection) and plotly travel as files,
# with the narwhals and typing-extensions releases they need (the image's own may be older).
# gpu_lease.sh installs them there only when its python cannot import them.
#
#   PY_VERSION=3.12 bash calibration/lease_wheels.sh      # about 15 MB
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION="${PY_VERSION:-3.12}"
# pydantic-core must be the exact release its pydantic names; these pins are a set that works together.
WHEELS=(simpy==4.1.2 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
        plotly==7.1.0 narwhals==2.29.0 typing-extensions==4.15.0)
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
du -sh .whl
