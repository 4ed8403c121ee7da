#!/usr/bin/env bash
# Builds the three images deploy/compose.yaml runs, without pulling anything: each is FROM
# scratch and holds binaries of this host plus the shared libraries `ldd` lists for them.
#
#   countersign:local        approval-gateway and agent-worker from TARGET_DIR, the example
#                            agents in /etc/countersign/agents, the host's CA certificates
#   countersign/nats:local   /usr/sbin/nats-server           (apt-get install nats-server)
#   countersign/redis:local  /usr/bin/redis-server, redis-cli, and redis-sentinel (the server
#                            started under that name runs as a Sentinel; apt-get install
#                            redis-server), with deploy/redis/sentinel.conf in /sentinel
#
# Usage: deploy/build-local-images.sh [TARGET_DIR]      (default: target/release)
#   e.g. cargo build --release -p approval-gateway -p agent-worker
#        deploy/build-local-images.sh
# Names: COUNTERSIGN_IMAGE, NATS_IMAGE, REDIS_IMAGE (the same variables the compose file
# reads); AGENTS_DIR picks another agents folder (default examples/agents).
#
# Every image runs as a user of its own (no root), has /tmp (1777) and a /data it owns, and
# no shell: healthchecks use `approval-gateway probe URL`, `agent-worker probe URL` and
# `redis-cli ping`. The binaries must come from a glibc no newer than the host's (they run
# on the host's libraries, copied next to them).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${1:-$repo/target/release}
agents_dir=${AGENTS_DIR:-$repo/examples/agents}
countersign_image=${COUNTERSIGN_IMAGE:-countersign:local}
nats_image=${NATS_IMAGE:-countersign/nats:local}
redis_image=${REDIS_IMAGE:-countersign/redis:local}

die() {
    echo "build-local-images: $*" >&2
    exit 1
}

command -v docker >/dev/null || die "docker is not installed"
command -v ldd >/dev/null || die "ldd is not installed (it is in libc-bin)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# add FILE ROOT [DEST]: copies FILE (following symlinks) to ROOT/DEST and every library ldd
# lists for it to the same path under ROOT, the dynamic loader included.
add() {
    local file=$1 root=$2 dest=${3:-$1}
    [[ -x $file ]] || die "$file is missing or not executable"
    install -D -m 0755 "$(readlink -f "$file")" "$root$dest"
    local libs
    # A static binary makes ldd say "not a dynamic executable" and fail: nothing to copy.
    libs=$(ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }') || true
    local lib
    for lib in $libs; do
        install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

# base ROOT USER UID: the files every image has. /etc/passwd and /etc/group name the user;
# ROOT/owned/ is copied with the user as owner, so /data (and any volume Docker fills from
# it) is writable by that user.
base() {
    local root=$1 user=$2 uid=$3
    mkdir -p "$root/files/etc" "$root/files/tmp" "$root/owned/data"
    chmod 1777 "$root/files/tmp"
    printf '%s:x:%s:%s:%s:/data:/sbin/nologin\n' "$user" "$uid" "$uid" "$user" >"$root/files/etc/passwd"
    printf '%s:x:%s:\n' "$user" "$uid" >"$root/files/etc/group"
}

# build ROOT IMAGE UID DOCKERFILE_TAIL: writes the Dockerfile and builds it.
build() {
    local root=$1 image=$2 uid=$3 tail=$4
    cat >"$root/Dockerfile" <<EOF
FROM scratch
COPY files/ /
COPY --chown=$uid:$uid owned/ /
ENV PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin
USER $uid:$uid
WORKDIR /data
$tail
EOF
    local out
    out=$(docker build -q -t "$image" "$root" 2>&1) || die "docker build of $image failed: $out"
    echo "built $image ($(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec))"
}

# NATS: the server alone; the compose file gives the cluster flags.
root=$work/nats
base "$root" nats 10002
add /usr/sbin/nats-server "$root/files"
build "$root" "$nats_image" 10002 '
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]'

# Redis: the server, the CLI for healthchecks, the Sentinel name, and the Sentinel's seed
# config in /sentinel, which must stay writable (a Sentinel rewrites its config file).
root=$work/redis
base "$root" redis 10003
add /usr/bin/redis-server "$root/files"
add /usr/bin/redis-cli "$root/files"
# Redis picks its mode from the name it was started under: redis-check-rdb (the name Debian's
# redis-server links to) checks a file, redis-sentinel runs a Sentinel.
ln -s redis-server "$root/files/usr/bin/redis-sentinel"
install -D -m 0644 "$repo/deploy/redis/sentinel.conf" "$root/owned/sentinel/sentinel.conf"
build "$root" "$redis_image" 10003 '
EXPOSE 6379 26379
CMD ["redis-server"]'

# countersign: both services, the agents and the CA certificates.
root=$work/countersign
base "$root" countersign 10001
for bin in approval-gateway agent-worker; do
    [[ -x $target_dir/$bin ]] ||
        die "$target_dir/$bin is missing: cargo build --release -p approval-gateway -p agent-worker, or pass the target dir"
    add "$target_dir/$bin" "$root/files" "/usr/local/bin/$bin"
    # A debug build is mostly debug info: the image keeps the symbols but not that.
    if command -v strip >/dev/null; then
        strip --strip-debug "$root/files/usr/local/bin/$bin"
    fi
done
[[ -d $agents_dir ]] || die "no agents folder at $agents_dir"
mkdir -p "$root/files/etc/countersign/agents"
cp "$agents_dir"/*.toml "$root/files/etc/countersign/agents/"
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || die "no /etc/ssl/certs/ca-certificates.crt: apt-get install ca-certificates"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/files/etc/ssl/certs/ca-certificates.crt"
build "$root" "$countersign_image" 10001 '
ENV COUNTERSIGN_AGENTS_DIR=/etc/countersign/agents LOG_FORMAT=json SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
EXPOSE 8080 9090
CMD ["approval-gateway"]'
