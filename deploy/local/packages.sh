# Sourced by the scripts in this folder: installs what sdn-node's tests and demo need from the
# distribution's packages, once (nothing is installed if everything is present).
ensure_packages() {
  local missing=()
  command -v ovs-vswitchd >/dev/null 2>&1 || missing+=(openvswitch-switch)
  command -v ovs-ofctl >/dev/null 2>&1 || missing+=(openvswitch-common)
  command -v ping >/dev/null 2>&1 || missing+=(iputils-ping)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  # hostnet: builds against libnftnl/libmnl (nftnl crate); its tests use nft and ethtool as
  # independent oracles.
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  dpkg -s libnftnl-dev >/dev/null 2>&1 || missing+=(libnftnl-dev)
  dpkg -s libmnl-dev >/dev/null 2>&1 || missing+=(libmnl-dev)
  command -v nft >/dev/null 2>&1 || missing+=(nftables)
  command -v ethtool >/dev/null 2>&1 || missing+=(ethtool)
  # tests/deploy.rs compiles the DaemonSet's AppArmor profile (without loading it).
  command -v apparmor_parser >/dev/null 2>&1 || missing+=(apparmor)
  # The image (deploy/image/build.sh, tests/image.rs): see image_packages_missing below.
  missing+=($(image_packages_missing))
  # cni: the plugin's tests drive it through libcni, the reference Go library runtimes use
  # (built in GOPATH mode from Debian's sources); the reference plugins come along for demos.
  command -v go >/dev/null 2>&1 || missing+=(golang-go)
  [ -d /usr/share/gocode/src/github.com/containernetworking/cni/libcni ] || missing+=(golang-github-appc-cni-dev)
  [ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
  # tests/podman.rs: containers on sdn-node networks run by Debian's podman (CNI backend) with
  # runc (crun fails on hybrid cgroups), from an image of one static busybox built offline.
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# What deploy/image/build.sh and tests/image.rs need (issue 34): buildah builds the image
# FROM scratch offline; podman runs it (Debian's podman 4.3 with conmon) and runc is the
# runtime the tests' containers.conf names (crun fails on hybrid cgroups); ldd (libc-bin) lists
# the libraries, strip (binutils) drops debug info, ca-certificates provides the CA bundle the
# image ships. Prints the packages that are missing, one per line.
image_packages_missing() {
  command -v buildah >/dev/null 2>&1 || echo buildah
  command -v podman >/dev/null 2>&1 || echo podman
  command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || echo runc
  command -v strip >/dev/null 2>&1 || echo binutils
  [ -f /etc/ssl/certs/ca-certificates.crt ] || echo ca-certificates
}
