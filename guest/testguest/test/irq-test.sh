#!/bin/sh
# irq-test.sh GUEST MICROVM [QEMU] - testguest.irq=1 end to end, under QEMU
# (TCG: a normal x86 machine whose IOAPIC and LAPIC deliver interrupts, which
# PVM hosts cannot) with microvm's vsock device served by
# `microvm vhost-user-vsock`:
#   echo:    the host connects and echoes 1 MiB of random bytes, compared;
#   connect: the guest connects to a host echo server (socat on
#            <uds>_5000) and checks 1 MiB of its pattern coming back.
# Each must end with QEMU status 1 (guest status 0), the guest's
# "irq: IOAPIC pin ..." line, and a stats line with irqs > 0. QEMU_ACCEL
# overrides "-accel tcg". Every wait is bounded; background processes are
# killed on exit.
set -u
guest=${1:?usage: irq-test.sh GUEST MICROVM [QEMU]}
microvm=${2:?usage: irq-test.sh GUEST MICROVM [QEMU]}
qemu=${3:-qemu-system-x86_64}
accel=${QEMU_ACCEL:-"-accel tcg -cpu max"}

for tool in "$qemu" socat; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		if [ "${CI:-}" = true ]; then
			echo "irq-test: $tool not found (CI=true: failing)"
			exit 1
		fi
		echo "irq-test: $tool not found: skipped"
		exit 0
	fi
done

# Short: Unix socket paths are limited to 107 bytes.
D=$(mktemp -d /tmp/tgirqXXXXXX) || exit 1
pids=""
cleanup() {
	for p in $pids; do
		kill "$p" 2>/dev/null
	done
	for p in $pids; do
		wait "$p" 2>/dev/null
	done
	rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fails=0
fail() {
	echo "FAIL $1"
	shift
	for f in "$@"; do
		[ -f "$f" ] && sed "s|^|    $(basename "$f"): |" "$f"
	done
	fails=$((fails + 1))
}

# wait_for SECONDS CMD...: poll CMD every 0.1 s.
wait_for() {
	n=$(($1 * 10))
	shift
	while [ "$n" -gt 0 ]; do
		"$@" && return 0
		sleep 0.1
		n=$((n - 1))
	done
	return 1
}

# backend NAME: start a vhost-user back-end with sockets $D/NAME.*.
backend() {
	"$microvm" vhost-user-vsock --socket "$D/$1.vhu" --guest-cid 3 --uds-path "$D/$1.v" \
		--log-level info 2>"$D/$1.backend" &
	pids="$pids $!"
	wait_for 10 test -S "$D/$1.vhu"
}

# run_qemu NAME CMDLINE &: boot the guest against back-end NAME, 60 s at
# most. It execs timeout, so $! is a pid that stops QEMU when killed.
run_qemu() {
	exec timeout 60 "$qemu" -M microvm,acpi=off,memory-backend=mem $accel -m 256M \
		-object memory-backend-memfd,id=mem,size=256M,share=on \
		-chardev socket,id=vc,path="$D/$1.vhu" -device vhost-user-vsock-device,chardev=vc \
		-global virtio-mmio.force-legacy=false -kernel "$guest" -append "$2" \
		-device isa-debug-exit,iobase=0xf4,iosize=4 -nodefaults -nographic -serial stdio \
		>"$D/$1.console" 2>"$D/$1.qemu"
}

# check_guest NAME STATUS WANT_LINE: status 1, the lines, irqs > 0.
check_guest() {
	name=$1 got=$2 line=$3
	out=$D/$name.console
	irqs=$(sed -n 's/^testguest: stats: .*, irqs \([0-9]*\) .*/\1/p' "$out")
	if [ "$got" -ne 1 ]; then
		fail "$name: QEMU exited $got, want 1 (guest status 0)" "$out" "$D/$name.qemu" \
			"$D/$name.backend"
	elif ! grep -q '^testguest: irq: IOAPIC pin [0-9]* -> LAPIC' "$out" ||
		! grep -qF -- "$line" "$out"; then
		fail "$name: missing the irq line or '$line'" "$out"
	elif [ -z "$irqs" ] || [ "$irqs" -eq 0 ]; then
		fail "$name: no interrupts counted (irqs '${irqs}')" "$out"
	else
		echo "ok   $name: $(grep '^testguest: stats:' "$out" | sed 's/.*, irqs/irqs/')"
	fi
}

t0=$(date +%s)

# 1. echo: host-initiated, 1 MiB of random bytes must come back unchanged.
if backend echo; then
	head -c 1048576 /dev/urandom >"$D/echo.in"
	run_qemu echo "testguest.mode=echo testguest.port=1024 testguest.conns=1 testguest.irq=1" &
	qpid=$!
	pids="$pids $qpid"
	# Until the guest listens or QEMU is gone.
	wait_for 30 sh -c "grep -q '^testguest: listening 1024\$' '$D/echo.console' ||
		! kill -0 $qpid 2>/dev/null"
	if grep -q '^testguest: listening 1024$' "$D/echo.console"; then
		timeout 30 "$microvm" vsock-connect --uds "$D/echo.v" --port 1024 \
			<"$D/echo.in" >"$D/echo.out" 2>"$D/echo.client"
		crc=$?
		wait "$qpid"
		qrc=$?
		if [ "$crc" -ne 0 ] || ! cmp -s "$D/echo.in" "$D/echo.out"; then
			fail "echo: client exit $crc, $(wc -c <"$D/echo.out") bytes back, differ" \
				"$D/echo.client" "$D/echo.console"
		else
			check_guest echo "$qrc" "testguest: echo done: 1 connections"
		fi
	else
		wait "$qpid"
		fail "echo: the guest never listened (QEMU exit $?)" "$D/echo.console" \
			"$D/echo.qemu" "$D/echo.backend"
	fi
else
	fail "echo: the back-end did not start" "$D/echo.backend"
fi

# 2. connect: guest-initiated, to a host echo server on <uds>_5000.
if backend connect; then
	socat UNIX-LISTEN:"$D/connect.v_5000",fork EXEC:cat 2>"$D/connect.socat" &
	pids="$pids $!"
	if wait_for 10 test -S "$D/connect.v_5000"; then
		run_qemu connect "testguest.mode=connect testguest.port=5000 testguest.bytes=1M testguest.irq=1" &
		qpid=$!
		pids="$pids $qpid"
		wait "$qpid"
		check_guest connect $? "testguest: connect ok: 1048576 bytes echoed"
	else
		fail "connect: the socat echo server did not start" "$D/connect.socat"
	fi
else
	fail "connect: the back-end did not start" "$D/connect.backend"
fi

if [ "$fails" -ne 0 ]; then
	echo "irq-test: $fails failed ($accel)"
	exit 1
fi
echo "irq-test: all passed in $(($(date +%s) - t0)) s ($accel)"
