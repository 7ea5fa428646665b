# The embedded default on the CPU: the tiny random-weight Qwen3-Omni, built into a volume on first
# start (meaningless text and noise audio: for trying the API, not for talking to).
#   docker build -f docker/cpu.Dockerfile -t omnivoice:cpu .        (from the repository root)
#   docker run --rm -p 8000:8000 --shm-size=1g -v "$PWD/configs:/configs:ro"
#       -v omnivoice-cache:/home/omnivoice/.cache/omnivoice omnivoice:cpu       (one command; see README)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, with the README's and .ci/run's pin, from PyTorch's CPU index: the same release without
# the multi-GB CUDA libraries that PyPI's Linux wheel brings. `pip install .` then keeps it.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /opt/omnivoice
COPY pyproject.toml README.md ./
COPY omnivoice ./omnivoice
RUN pip install --no-cache-dir . \
    && python -c "import torch; assert torch.version.cuda is None, torch.__version__"

# profiles: the shipped ones, or the host's configs/ mounted over them (-v ./configs:/configs:ro)
COPY configs /configs
RUN groupadd --gid 10001 omnivoice \
    && useradd --create-home --uid 10001 --gid 10001 omnivoice \
    && mkdir -p /home/omnivoice/.cache/omnivoice \
    && chown -R 10001:10001 /home/omnivoice/.cache
USER 10001:10001
WORKDIR /home/omnivoice
# the tiny model's build (~1 min once), kept across containers
VOLUME ["/home/omnivoice/.cache/omnivoice"]

EXPOSE 8000
# /health is 503 while the model loads or after a stage worker died, 200 when serving (port: the profile's)
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["omnivoice"]
CMD ["serve", "--host", "0.0.0.0", "--profile", "/configs/cpu.yaml"]
