# Sourced by the scripts in this folder: installs what sdn-node's tests and demo need from the
# distribution's packages, once (nothing is installed if everything is present).
ensure_packages() {
  local missing=()
  command -v ovs-vswitchd >/dev/null 2>&1 || missing+=(openvswitch-switch)
  command -v ovs-ofctl >/dev/null 2>&1 || missing+=(openvswitch-common)
  command -v ping >/dev/null 2>&1 || missing+=(iputils-ping)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}
