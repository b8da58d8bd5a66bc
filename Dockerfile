# servelab's image: the repository's workflow and package with the locked runtime dependencies,
# for the campaign as a Job in the cluster (docs/kubernetes.md, "The campaign as a Job").
#
#   docker build --build-arg SERVELAB_GIT_COMMIT=$(git rev-parse HEAD) -t REGISTRY/servelab:TAG .
#
# The Job runs `snakemake` in /opt/servelab (this checkout), whose results/ and .snakemake/ are
# links into /work, where the campaign volume is mounted. Nothing secret goes in: no token, no
# kubeconfig, no credentials of any kind (the Job's pod gets its ServiceAccount's token from the
# cluster, the engines their Hugging Face token from their Secret). tests/unit/test_dockerfile.py
# checks this file's structure.

# python:3.11-slim-bookworm (CPython 3.11.16), pinned by the digest of its multi-platform OCI
# index as Docker Hub published the tag in September 2026. No registry is reachable from where
# this file was written: check the digest before the first build, and move the pin on purpose:
#   docker buildx imagetools inspect python:3.11-slim-bookworm
FROM python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# The commit built, recorded in every run.json (servelab.artifacts.provenance: there is no .git
# in the image).
ARG SERVELAB_GIT_COMMIT=unknown
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SERVELAB_GIT_COMMIT=${SERVELAB_GIT_COMMIT}

WORKDIR /opt/servelab

# The locked runtime environment first (exact versions, PyPI hashes; the build backend too), in
# its own layer: it is rebuilt only when the lock changes. The same install as `make verify`.
COPY requirements/verify.lock requirements/verify.lock
RUN python -m pip install --require-hashes --no-deps -r requirements/verify.lock

# Then servelab itself, from this checkout, with nothing the lock does not pin.
COPY pyproject.toml README.md LICENSE CITATION.cff Snakefile environment.yml ./
COPY src ./src
COPY workflow ./workflow
COPY config ./config
COPY profiles ./profiles
RUN python -m pip install --no-deps --no-build-isolation . \
    && rm -rf build src/servelab.egg-info \
    && python -c "import servelab, snakemake; print('servelab', servelab.__version__)"

# The campaign's state lives on its volume (mounted at /work); a non-root user runs everything.
RUN ln -s /work/results results \
    && ln -s /work/.snakemake .snakemake \
    && groupadd --gid 10001 servelab \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin servelab

USER 10001:10001
ENTRYPOINT ["snakemake"]
CMD ["--help"]
