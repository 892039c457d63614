# The BSO worker (both task queues). Build: docker build -t bso-worker .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: the agents' git discipline (commits, squash) runs in the project's repository.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bso ./bso
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
# The worker imports these from /app: with PYTHONDONTWRITEBYTECODE nothing would cache their bytecode,
# and the workflow sandbox would compile each workflow module again for every new workflow.
RUN pip install . && python -m compileall -q bso workflows activities workers

RUN useradd --create-home --uid 1000 bso
USER bso

ENV TEMPORAL_ADDRESS=temporal:7233 \
    TEMPORAL_NAMESPACE=default
CMD ["python", "-m", "workers.main"]
