#!/bin/sh
# qemu-test.sh GUEST [QEMU] - boot checks of the test guest under QEMU's
# microvm machine: exit statuses, console lines, CPU counts, and the virtio
# transport against a virtio-rng device. Uses KVM when /dev/kvm is usable,
# else TCG; QEMU_ACCEL overrides ("-accel tcg"). QEMU's isa-debug-exit turns
# guest status b into (b << 1) | 1.
set -u
guest=${1:?usage: qemu-test.sh GUEST [QEMU]}
qemu=${2:-qemu-system-x86_64}
if ! command -v "$qemu" >/dev/null 2>&1; then
	echo "qemu-test: $qemu not found: skipped"
	exit 0
fi
if [ -n "${QEMU_ACCEL:-}" ]; then
	accel=$QEMU_ACCEL
elif [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
	accel="-enable-kvm -cpu host,-arch-capabilities"
else
	accel="-accel tcg"
fi
fails=0

# check NAME WANT_STATUS WANT_LINE QEMU_ARGS...
check() {
	name=$1 want=$2 line=$3
	shift 3
	out=$(timeout 60 "$qemu" -M microvm,acpi=off $accel -kernel "$guest" \
		-device isa-debug-exit,iobase=0xf4,iosize=4 -nodefaults -nographic \
		-serial stdio "$@" 2>/dev/null)
	got=$?
	if [ "$got" -eq "$want" ] && printf '%s\n' "$out" | grep -qxF -- "$line"; then
		echo "ok   $name (status $got)"
	else
		echo "FAIL $name: status $got (want $want), output:"
		printf '%s\n' "$out" | sed 's/^/    /'
		echo "    (want the line: $line)"
		fails=$((fails + 1))
	fi
}

modern="-global virtio-mmio.force-legacy=false"
check hello 1 "testguest: hello cpus=1" -append "testguest.mode=hello"
check hello-smp2 1 "testguest: hello cpus=2" -smp 2 -append "testguest.mode=hello"
check fail 7 "testguest: fail mode: exiting with status 3" -append "testguest.mode=fail"
check bad-cmdline 17 "testguest: bad command line: unknown mode in 'testguest.mode=nope'" \
	-append "testguest.mode=nope"
# testguest.irq=1: refused early where KVM is PVM (CPL3 runs with IOPL 0 there);
# elsewhere the interrupt path is checked against virtio-rng below (and
# against vsock by irq-test.sh).
pvm=false
case "$accel" in *kvm*) [ -e /sys/module/kvm_pvm ] && pvm=true ;; esac
if $pvm; then
	check irq-pvm 17 "testguest: irq mode unsupported: CPL3 runs with IOPL 0, not the 3 boot.S set: a PVM host, which cannot deliver interrupts to this guest" \
		-append "testguest.mode=hello testguest.irq=1"
else
	check irq-hello 1 "testguest: hello cpus=1" -append "testguest.mode=hello testguest.irq=1"
fi
check no-vsock 11 "testguest: no virtio-vsock device (0 virtio_mmio.device entries)" \
	-append "testguest.mode=echo testguest.port=1234"
check no-vsock-rng-only 11 "testguest: no virtio-vsock device (1 virtio_mmio.device entries)" \
	$modern -device virtio-rng-device -append "testguest.mode=connect testguest.port=1 testguest.bytes=1"
check virtio-rng 1 "testguest: rng ok: 1048576 bytes in 256 requests, queue 8, features 0x120000000, kicks 32" \
	$modern -device virtio-rng-device -append "testguest.mode=rng testguest.bytes=1M"
check virtio-rng-no-event-idx 1 "testguest: rng ok: 1048576 bytes in 256 requests, queue 8, features 0x100000000, kicks 32" \
	$modern -device virtio-rng-device,event_idx=off -append "testguest.mode=rng testguest.bytes=1M"
if ! $pvm; then
	# The interrupt count depends on timing: any number above 0.
	out=$(timeout 60 "$qemu" -M microvm,acpi=off $accel -kernel "$guest" \
		-device isa-debug-exit,iobase=0xf4,iosize=4 -nodefaults -nographic -serial stdio \
		$modern -device virtio-rng-device -append "testguest.mode=rng testguest.bytes=1M testguest.irq=1" 2>/dev/null)
	got=$?
	if [ "$got" -eq 1 ] && printf '%s\n' "$out" |
		grep -qE '^testguest: rng ok: 1048576 bytes in 256 requests, queue 8, features 0x120000000, kicks 32, irqs [1-9][0-9]*$'; then
		echo "ok   virtio-rng-irq (status $got)"
	else
		echo "FAIL virtio-rng-irq: status $got (want 1), output:"
		printf '%s\n' "$out" | sed 's/^/    /'
		fails=$((fails + 1))
	fi
fi
# With ACPI the CPU count comes from the MADT instead of the MP table.
out=$(timeout 60 "$qemu" -M microvm,acpi=on $accel -smp 2 -kernel "$guest" \
	-device isa-debug-exit,iobase=0xf4,iosize=4 -nodefaults -nographic -serial stdio \
	-append "testguest.mode=hello" 2>/dev/null)
if [ "$out" = "testguest: hello cpus=2" ]; then echo "ok   hello-acpi-smp2"; else
	echo "FAIL hello-acpi-smp2: $out"; fails=$((fails + 1)); fi

if [ "$fails" -ne 0 ]; then
	echo "qemu-test: $fails failed ($accel)"
	exit 1
fi
echo "qemu-test: all passed ($accel)"
