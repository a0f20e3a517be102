#!/bin/sh
# Builds the sdn-node image offline, with no base image: `buildah from scratch`, then the two
# release binaries (stripped of debug info) and exactly the files they need at run time:
#   - the shared libraries `ldd` lists for them, at the paths the dynamic loader looks them up
#     (the ELF interpreter /lib64/ld-linux-x86-64.so.2, glibc's libc and libm, libgcc_s, and
#     libnftnl and libmnl, which hostnet links for nftables);
#   - /etc/ssl/certs/ca-certificates.crt (an API server with a publicly signed certificate;
#     in cluster the service account's CA bundle is used), /etc/nsswitch.conf (host names from
#     /etc/hosts, then DNS: glibc's own files and dns modules, built into libc.so.6 since 2.34),
#     /etc/passwd and /etc/group (root and the image's non-root user 65532), an empty /tmp.
# Tagged with the crate's version (Cargo.toml), with the OCI labels and annotations version,
# revision (the git commit), source (the git remote, if any), licenses, title, created.
#
#   deploy/image/build.sh                  # builds target/release binaries first (cargo --release)
#   SDN_NODE_BIN_DIR=target/debug deploy/image/build.sh   # uses binaries already built there
#   SDN_NODE_IMAGE=localhost/sdn-node:dev deploy/image/build.sh
#
# Needs buildah (Debian's package) and, for the library list, ldd; runs as root or in a user
# namespace buildah sets up. No registry is contacted. Prints the file list and the image's
# size; the LAST line of its output is the image reference it built (tests read it).
# The equivalent build with a public base image, where a registry is reachable, is
# deploy/Dockerfile.
set -eu

repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${SDN_NODE_BIN_DIR:-}" ]; then
  bindir=$(cd "$SDN_NODE_BIN_DIR" && pwd) || { echo "build.sh: SDN_NODE_BIN_DIR=$SDN_NODE_BIN_DIR: no such directory" >&2; exit 1; }
fi
cd "$repo"

version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "build.sh: no [package] version in Cargo.toml" >&2; exit 1; }
image=${SDN_NODE_IMAGE:-localhost/sdn-node:$version}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then revision="$revision-dirty"; fi
source_url=${SDN_NODE_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}

command -v buildah >/dev/null 2>&1 || { echo "build.sh: buildah is not installed (deploy/local/packages.sh installs it)" >&2; exit 1; }

if [ -z "${SDN_NODE_BIN_DIR:-}" ]; then
  cargo build --release --locked -p sdn-node --bin sdn-node -p sdn-node-cni --bin sdn-node-cni >&2
  bindir=${CARGO_TARGET_DIR:-$repo/target}/release
  case $bindir in /*) ;; *) bindir=$repo/$bindir ;; esac
fi
for b in sdn-node sdn-node-cni; do
  [ -x "$bindir/$b" ] || { echo "build.sh: $bindir/$b: not an executable" >&2; exit 1; }
done

stage=$(mktemp -d "${TMPDIR:-/tmp}/sdn-node-image.XXXXXX")
ctr=
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$stage"
}
trap cleanup EXIT INT TERM
root=$stage/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"

# The binaries, without debug info (the release profile keeps line tables for profiling).
for b in sdn-node sdn-node-cni; do
  cp "$bindir/$b" "$root/usr/local/bin/$b"
  if command -v strip >/dev/null 2>&1; then strip --strip-debug "$root/usr/local/bin/$b"; fi
  chmod 0755 "$root/usr/local/bin/$b"
done

# The shared libraries, at the paths ldd resolved them to (the loader's default directories),
# and the ELF interpreter at its absolute path. Symlinks are followed: regular files only.
libs=$(for b in sdn-node sdn-node-cni; do ldd "$bindir/$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
[ -e "$root/lib64/ld-linux-x86-64.so.2" ] || [ -n "$(ls "$root"/lib*/ld-linux* 2>/dev/null)" ] ||
  { echo "build.sh: ldd named no ELF interpreter" >&2; exit 1; }

cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt" ||
  { echo "build.sh: /etc/ssl/certs/ca-certificates.crt missing (Debian's ca-certificates)" >&2; exit 1; }
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"

# The image: nothing but these files.
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ctr=$(buildah from scratch)
buildah copy --quiet "$ctr" "$root/" / >/dev/null
set -- \
  org.opencontainers.image.title=sdn-node \
  "org.opencontainers.image.description=Node agent that programs Open vSwitch for a Kubernetes pod network, and its CNI plugin" \
  "org.opencontainers.image.version=$version" \
  "org.opencontainers.image.revision=$revision" \
  org.opencontainers.image.licenses=Apache-2.0 \
  "org.opencontainers.image.created=$created"
if [ -n "$source_url" ]; then set -- "$@" "org.opencontainers.image.source=$source_url"; fi
for kv in "$@"; do
  buildah config --label "$kv" --annotation "$kv" "$ctr"
done
# As deploy/Dockerfile: non-root by default (the DaemonSet and `podman run --user 0` run the
# agent as root, which OVS's root-owned sockets need).
buildah config --user 65532:65532 --workingdir / \
  --entrypoint '["/usr/local/bin/sdn-node"]' --cmd --help "$ctr"
buildah commit --quiet --format oci "$ctr" "$image" >/dev/null
buildah rm "$ctr" >/dev/null
ctr=

echo "files in $image:"
(cd "$root" && find . \( -type f -o -type l \) -printf '%10s  /%P\n' | sort -k2)
size=$(podman image inspect --format '{{.Size}}' "$image" 2>/dev/null || true)
[ -n "$size" ] || size=$(du -sb "$root" | cut -f1)
echo "image size: $size bytes ($(( (size + 524288) / 1048576 )) MiB), revision $revision"
echo "$image"
