#!/usr/bin/env bash
# Run THERE (GPU machine, repo root): `stash DIR…` keeps the Ray pieces stage_ray.sh wrote in
# /root/persist/ray (which survives while the machine stays warm); `install` reassembles the
# wheel, checks its sha256 and pip-installs it with the small wheels into /tmp/site.
set -euo pipefail
PERSIST=${PERSIST:-/root/persist/ray}
SITE=${SITE:-/tmp/site}
mkdir -p "$PERSIST"
case ${1:?usage: ray_parts.sh stash DIR... | install} in
  stash) shift; for d in "$@"; do cp -f "$d"/* "$PERSIST/"; done
         echo "ray pieces stashed: $(ls "$PERSIST" | grep -c piece)" ;;
  install)
    cd "$PERSIST"
    wheel=$(awk '{print $2}' ray.sha256)
    cat ray.whl.piece-* > "$wheel" && sha256sum --quiet -c ray.sha256
    for whl in *.whl; do  # keep the image's own copy of a package when it has one
      dist=$(basename "$whl" | cut -d- -f1)
      [ "$dist" = ray ] || ! python3 -c "import importlib.metadata as m; m.version('$dist')" 2>/dev/null \
        || continue
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$whl"
    done
    PYTHONPATH=$SITE python3 -c 'import ray; print("ray", ray.__version__)' ;;
esac
