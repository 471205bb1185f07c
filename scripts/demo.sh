#!/usr/bin/env bash
# The `make run` demo: boot the bundled test guest on two vCPUs, then boot it
# again as a vsock echo server and talk to it from the host through the VM's
# Unix socket, the way a CI runner talks to its guest agent.
set -euo pipefail
cd "$(dirname "$0")/.."
MICROVM=${MICROVM:-bin/microvm}
GUEST=${GUEST:-bin/testguest}

# The demo needs a KVM that runs the poll-mode test guest: hardware or PVM.
# Without one it runs in the nested-KVM box instead (docs/testing.md).
if [[ "$(scripts/host-kvm)" == none ]]; then
	echo "demo: this host has no usable /dev/kvm; running the demo in the nested-KVM box (QEMU TCG; its first run builds the box's kernel, about 7 minutes)"
	exec scripts/kvmbox --timeout 30m -- scripts/demo.sh
fi

echo "== 1. boot: the test guest counts its CPUs and exits through port 0xf4"
"$MICROVM" run --kernel "$GUEST" --cmdline testguest.mode=hello --cpus 2
echo "   microvm exited with status $?"

echo "== 2. vsock: the guest echoes on port 1024; the host connects through the Unix socket"
dir=$(mktemp -d)
trap 'kill "$vm" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$MICROVM" run --kernel "$GUEST" --vsock-cid 3 --vsock-uds "$dir/v.sock" \
	--cmdline "testguest.mode=echo testguest.port=1024 testguest.conns=1" >"$dir/console" &
vm=$!
for _ in $(seq 100); do
	grep -q "listening 1024" "$dir/console" 2>/dev/null && break
	sleep 0.05
done
msg="hello from the host, $(date -u +%H:%M:%S)"
echo "   host sends:    $msg"
reply=$(printf '%s\n' "$msg" | "$MICROVM" vsock-connect --uds "$dir/v.sock" --port 1024)
echo "   guest echoes:  $reply"
wait "$vm"
echo "   microvm exited with status $? after the connection closed"
sed 's/^/   console: /' "$dir/console"
[ "$reply" = "$msg" ]
