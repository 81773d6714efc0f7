#!/usr/bin/env bash
# Ensures DIR (default $HSDP_BUILD_DIR/third_party/etcd, else
# <repo>/build/third_party/etcd) holds what the etcd client and its tests
# need, from Debian bookworm's packages, extracted (not installed) with
# `dpkg -x`:
#   golang-etcd-server-dev   etcd's .proto files (usr/share/gocode/src/go.etcd.io/etcd/)
#   golang-github-gogo-protobuf-dev               gogoproto/gogo.proto
#   golang-github-grpc-ecosystem-grpc-gateway-dev google/api/{annotations,http}.proto
#   etcd-server              usr/bin/etcd     (the tests' cluster)
#   etcd-client              usr/bin/etcdctl  (the tests enable auth with it)
# Installing them instead would pull ~145 Go packages and start a system etcd.
# Idempotent: quiet and offline when the stamp and the files are there; prints
# one line when it fetches; exits non-zero with a message on failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-${HSDP_BUILD_DIR:-$ROOT/build}/third_party/etcd}"

PACKAGES=(golang-etcd-server-dev golang-github-gogo-protobuf-dev
          golang-github-grpc-ecosystem-grpc-gateway-dev etcd-server etcd-client)
GOCODE=usr/share/gocode/src
REQUIRED=(
  "$GOCODE/go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto"
  "$GOCODE/go.etcd.io/etcd/mvcc/mvccpb/kv.proto"
  "$GOCODE/go.etcd.io/etcd/auth/authpb/auth.proto"
  "$GOCODE/github.com/gogo/protobuf/gogoproto/gogo.proto"
  "$GOCODE/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/annotations.proto"
  "$GOCODE/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/http.proto"
  usr/bin/etcd
  usr/bin/etcdctl
)
STAMP_TEXT="${PACKAGES[*]}"

complete() {
  [ "$(cat "$DIR/.hsdp-etcd-stamp" 2>/dev/null)" = "$STAMP_TEXT" ] || return 1
  local f
  for f in "${REQUIRED[@]}"; do [ -e "$DIR/$f" ] || return 1; done
}

fail() { echo "etcd_env: $*" >&2; exit 1; }

if complete; then exit 0; fi

mkdir -p "$DIR" || fail "cannot create $DIR"
# Two builds configuring at once: one fetches, the other waits for it.
exec 9>"$DIR/.lock"
flock 9
if complete; then exit 0; fi

command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
  fail "needs apt-get and dpkg (Debian bookworm) to fetch ${PACKAGES[*]}"
echo "etcd_env: fetching etcd ${PACKAGES[*]} into $DIR" >&2

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# apt-get download runs its fetcher as _apt where it can; let it write here.
chmod 0777 "$TMP"
download() {
  (cd "$TMP" && apt-get download -qq "${PACKAGES[@]}") >"$TMP/apt.log" 2>&1
}
if ! download; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq >"$TMP/update.log" 2>&1 || true
  download || { cat "$TMP/update.log" "$TMP/apt.log" >&2 || true
                fail "apt-get download ${PACKAGES[*]} failed"; }
fi
for deb in "$TMP"/*.deb; do
  [ -e "$deb" ] || fail "apt-get download produced no .deb files"
  dpkg -x "$deb" "$DIR" || fail "dpkg -x $(basename "$deb") failed"
done
for f in "${REQUIRED[@]}"; do
  [ -e "$DIR/$f" ] || fail "$f is missing from the extracted packages in $DIR"
done
echo "$STAMP_TEXT" >"$DIR/.hsdp-etcd-stamp"
