#!/usr/bin/env bash
# Builds every image the docker tests and the compose stack use, from this machine's Debian
# package sources and Python wheels downloaded here: for machines whose docker engine reaches
# no image registry (and whose containers cannot reach the package index). Safe to run again:
# what exists is reused, and an unchanged checkout builds in seconds.
#
#   docker/build-local-images.sh        # then: make test-docker
#
# Tags: pikku-local/debian:bookworm (the base), pikku-celery:local (the app, as compose
# names it), pikku-local/{redis,rabbitmq,postgres}, and redis:latest / rabbitmq:latest, the
# names pytest-celery asks for (a local image of that name is used without a pull).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
BASE=pikku-local/debian:bookworm
SUITE=bookworm

if ! docker info >/dev/null 2>&1; then
  echo "no docker engine answers; start dockerd (or Docker Desktop) and run this again" >&2
  exit 1
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  # The apt sources this machine is configured with, as apt itself reads them.
  eval "$(apt-config shell ETC Dir::Etc/d SOURCELIST Dir::Etc::sourcelist/f SOURCEPARTS Dir::Etc::sourceparts/d)"
  sources=()
  [ -s "$SOURCELIST" ] && sources+=("$SOURCELIST")
  for file in "${SOURCEPARTS%/}"/*.list "${SOURCEPARTS%/}"/*.sources; do
    [ -s "$file" ] && sources+=("$file")
  done
  if [ ${#sources[@]} -eq 0 ]; then
    echo "apt has no sources configured under $ETC; add a Debian mirror, then run this again" >&2
    exit 1
  fi
  echo "building $BASE with mmdebstrap from ${sources[*]}"
  mmdebstrap --quiet --variant=minbase --format=tar "$SUITE" - "${sources[@]}" | docker import - "$BASE"
fi

# The classic builder (Debian's docker.io has no buildx for BuildKit) builds every stage
# before the target, and the test stage needs the package index: it is left out here.
build() {
  local dockerfile=$1
  shift
  awk '/^FROM .* AS tests$/ { skip = 1; next } /^FROM / { skip = 0 } !skip' "$dockerfile" |
    DOCKER_BUILDKIT=0 docker build --quiet --build-arg BASE_IMAGE="$BASE" -f - "$@" . >/dev/null
}

# The app's dependencies as wheels for the image's Python (Debian's, which must be the same
# minor version as the Python here: pip chooses the wheels for the interpreter it runs in).
build docker/Dockerfile --target python -t pikku-local/python:latest
image_python=$(docker run --rm pikku-local/python:latest python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
host_python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$image_python" != "$host_python" ]; then
  echo "the image's Python is $image_python but $PYTHON is $host_python; run this with" \
    "PYTHON=/path/to/python$image_python" >&2
  exit 1
fi
stamp=docker/wheels/.stamp
wanted="$host_python $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "downloading wheels into docker/wheels"
  find docker/wheels -name '*.whl' -delete
  # async-timeout: redis needs it below Python 3.11.3 (Debian's 3.11.2), not on newer ones.
  "$PYTHON" -m pip wheel --quiet --wheel-dir docker/wheels ".[dashboard,flower]" hatchling \
    "async-timeout>=4.0.3"
  # The image builds the package from this checkout; an old wheel of it must not stand in.
  rm -f docker/wheels/pikku_celery-*.whl
  echo "$wanted" > "$stamp"
fi

for service in redis rabbitmq postgres; do
  echo "building pikku-local/$service"
  build docker/services/Dockerfile --target "$service" -t "pikku-local/$service:latest"
done
docker tag pikku-local/redis:latest redis:latest
docker tag pikku-local/rabbitmq:latest rabbitmq:latest

echo "building pikku-celery:local"
build docker/Dockerfile --target app --build-arg PIP_NO_INDEX=1 -t pikku-celery:local
echo "images ready"
