# tpuwatch as a container: `tpuwatch` is the entrypoint, the arguments are a command.
#   docker build -t tpuwatch .
#   docker run --rm tpuwatch --help
# Nothing secret is in the image: the config, the SSH key and the credentials come at run time
# (deploy/kubernetes mounts them from a ConfigMap and a Secret, and uses Workload Identity).
FROM python:3.11-slim-bookworm

# The real OpenSSH client reaches the workers. Versions come from the base image's Debian
# release (bookworm), whose security updates replace any pinned version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client \
    && rm -rf /var/lib/apt/lists/*

# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it and ssh finds the user in
# /etc/passwd. deploy/kubernetes/deployment.yaml uses the same ids.
RUN groupadd --gid 10001 tpuwatch \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin tpuwatch \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/tpuwatch

WORKDIR /src
COPY pyproject.toml README.md ./
COPY tpuwatch ./tpuwatch
RUN pip install --no-cache-dir . && rm -rf /src

# Lines reach `kubectl logs` / journald as they are printed; the journal lives under the
# state volume (a directory of its own: tpuwatch refuses a group-writable state dir).
ENV PYTHONUNBUFFERED=1 \
    TPUWATCH_STATE_DIR=/var/lib/tpuwatch/state
USER 10001:10001
WORKDIR /home/tpuwatch
ENTRYPOINT ["tpuwatch"]
CMD ["watch", "-c", "/etc/tpuwatch/tpuwatch.toml", "--plain"]
