package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/pid1"
)

// setupSystem mounts /proc, /sys and /dev and makes sure stdin, stdout and
// stderr are the console. Failures are printed, not fatal: scenarios that do
// not need the missing piece can still run.
func setupSystem() {
	pid1.MountAll(pid1.Basic, func(format string, args ...any) { fmt.Printf("init: "+format+"\n", args...) })
	pid1.LinkResolvConf(func(format string, args ...any) { fmt.Printf("init: "+format+"\n", args...) })
	// The kernel opens /dev/console as fds 0-2 before starting /init; if the
	// initramfs had no /dev/console that failed, and we retry on devtmpfs.
	if _, err := unix.FcntlInt(1, unix.F_GETFD, 0); err != nil {
		if fd, err := unix.Open("/dev/console", unix.O_RDWR, 0); err == nil {
			for i := 0; i < 3; i++ {
				_ = unix.Dup2(fd, i)
			}
			if fd > 2 {
				unix.Close(fd)
			}
		}
	}
}

// readCmdline returns the kernel command line.
func readCmdline() (string, error) {
	b, err := os.ReadFile("/proc/cmdline")
	return string(b), err
}

// endVM ends the machine (pid1.End): with ACPI (microvm's default) it
// powers off; without (--acpi=off, QEMU's -M microvm,acpi=off) it restarts,
// which microvm (reboot=k) and QEMU (-no-reboot) take as the end. It never
// returns: PID 1 must not exit.
func endVM() {
	pid1.End(func(format string, args ...any) { fmt.Printf("init: "+format+"\n", args...) })
}
