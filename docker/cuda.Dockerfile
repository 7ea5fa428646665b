# GPU serving: a Qwen3-Omni checkpoint mounted read-only, served with a GPU profile (configs/h200.yaml).
#   docker build -f docker/cuda.Dockerfile -t omnivoice:cuda .      (from the repository root)
#   docker run --rm --gpus all -p 8000:8000 -v "$PWD/configs:/configs:ro"
#       -v /data/Qwen3-Omni-30B-A3B-Instruct:/models/Qwen3-Omni-30B-A3B-Instruct:ro omnivoice:cuda
#   (one command; or docker/compose.yaml)
# The `base` flavour of the CUDA image carries only what the NVIDIA container runtime needs (driver
# capabilities, the CUDA version check): torch's CUDA wheel brings its own CUDA libraries, so a
# `runtime` base would only add a second copy of them.
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's Python 3.12 in a venv (the system one is externally managed), and the C compiler and Python
# headers Triton builds its kernel launchers with (the compiled decode layers, `compile: true`); the
# base image fixes the release, so the packages are not pinned one by one
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# the CUDA build of the README's and .ci/run's torch pin (cu128: drivers >= 570)
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0

WORKDIR /opt/omnivoice
COPY pyproject.toml README.md ./
COPY omnivoice ./omnivoice
# with the ray extra: the same image serves alone or as a node of a Ray cluster (`worker: ray` stages);
# the project's own pyproject bounds its dependencies
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[ray]" \
    && python -c "import torch; assert torch.version.cuda, torch.__version__"

COPY configs /configs
RUN groupadd --gid 10001 omnivoice \
    && useradd --create-home --uid 10001 --gid 10001 omnivoice \
    && mkdir -p /home/omnivoice/.cache/omnivoice \
    && chown -R 10001:10001 /home/omnivoice/.cache
USER 10001:10001
WORKDIR /home/omnivoice
VOLUME ["/home/omnivoice/.cache/omnivoice"]

EXPOSE 8000
# loading a 66 GB checkpoint takes minutes: /health answers 503 until the stages are ready
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["omnivoice"]
CMD ["serve", "--host", "0.0.0.0", "--profile", "/configs/h200.yaml"]
