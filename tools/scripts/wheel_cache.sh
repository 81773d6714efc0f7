# Sourced by python_env.sh, frameworks_env.sh and bench_env.sh: how they make a
# virtual environment from pinned wheels, once. Needs BASE_PY and log().
#
#   venv_current VENV HASH       true, printing VENV's python, when VENV is there
#                                and its stamp says it was made from HASH (the
#                                hash of what it was made from): nothing to do
#   stamp_venv VENV HASH         records HASH in VENV's stamp, prints its python
#   new_venv VENV                an empty virtual environment of BASE_PY at VENV,
#                                in place of whatever was there
#   ensure_venv_support          apt-get python3-venv when BASE_PY lacks ensurepip
#   fill_wheel_cache CACHE REQ   takes the machine-wide lock on CACHE (held by the
#                                caller's shell until it exits: fd 9) and downloads
#                                only what REQ pins and CACHE lacks

venv_current() {
  local venv="$1" hash="$2"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.hsdp-stamp" 2>/dev/null)" = "$hash" ]; then
    echo "$venv/bin/python"
    return 0
  fi
  return 1
}

stamp_venv() {
  local venv="$1" hash="$2"
  echo "$hash" >"$venv/.hsdp-stamp"
  echo "$venv/bin/python"
}

new_venv() {
  local venv="$1"
  rm -rf "$venv"
  log "creating $venv"
  "$BASE_PY" -m venv "$venv"
}

ensure_venv_support() {
  if ! "$BASE_PY" -c 'import ensurepip' >/dev/null 2>&1; then
    log "installing python3-venv"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      python3-venv >/dev/null
  fi
}

fill_wheel_cache() {
  local cache="$1" req="$2"
  mkdir -p "$cache"
  # Serialize concurrent set-ups (several build folders, parallel CI steps) on
  # the machine-wide cache.
  exec 9>"$cache/.lock"
  flock 9
  # Download only what the cache lacks: pip download skips wheels already there.
  if ! "$BASE_PY" -m pip download -q --only-binary=:all: -d "$cache" -r "$req" --no-index \
       --find-links "$cache" >/dev/null 2>&1; then
    log "downloading the pinned wheels of $(basename "$req") into $cache (once per machine)"
    "$BASE_PY" -m pip download -q --only-binary=:all: -d "$cache" -r "$req" \
      --find-links "$cache" >&2
  fi
}
