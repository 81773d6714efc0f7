# The trainer's base: the hsdpd base image plus torch (CPU use) in the
# system Python. Built once per machine by tools/scripts/docker_images.py
# (tagged with a hash of this file, trainer-requirements.txt and the base),
# with the host network: apt fetches pip, and pip installs the pinned
# wheels from the project's wheel cache, served on 127.0.0.1 (WHEELS; empty
# = download them from PyPI). pip, apt's lists and pip's cache do not stay.
# Built with BuildKit (DOCKER_BUILDKIT=1: RUN --mount); one layer.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG WHEELS=""
RUN --mount=type=bind,source=trainer-requirements.txt,target=/tmp/trainer-requirements.txt \
    set -eu; export DEBIAN_FRONTEND=noninteractive; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends python3-pip >/dev/null; \
    if [ -n "$WHEELS" ]; then src="--no-index --find-links $WHEELS"; else src=""; fi; \
    python3 -m pip install -q --no-cache-dir --no-deps --break-system-packages \
      --root-user-action=ignore $src -r /tmp/trainer-requirements.txt; \
    apt-get purge -y -qq --auto-remove python3-pip >/dev/null; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /root/.cache; \
    site=/usr/local/lib/python3.11/dist-packages; \
    find "$site/nvidia/cudnn/lib" -name 'libcudnn_*.so.*' -delete; \
    find "$site" \( -name '*.a' -o -name '*.bc' \) -delete; \
    rm -rf "$site/torch/include" "$site"/nvidia/*/include "$site"/nvidia/cu13/lib/libnvperf*; \
    python3 -c 'import torch, torch.distributed; print("torch", torch.__version__)'
