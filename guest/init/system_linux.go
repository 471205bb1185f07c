package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// mounts are the file systems /init mounts before anything else. The kernel
// does not mount devtmpfs on /dev for an initramfs (DEVTMPFS_MOUNT applies to
// a real root only), so /init does.
var mounts = []struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
}

// setupSystem mounts /proc, /sys and /dev and makes sure stdin, stdout and
// stderr are the console. Failures are printed, not fatal: scenarios that do
// not need the missing piece can still run.
func setupSystem() {
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			fmt.Printf("init: mkdir %s: %v\n", m.target, err)
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			fmt.Printf("init: mount %s on %s: %v\n", m.fstype, m.target, err)
		}
	}
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

// endVM syncs and restarts the machine: with reboot=k on the command line
// Linux pulses the i8042 reset line (microvm exits 0); where there is no
// i8042 (QEMU's -M microvm) it falls back to a triple fault, which QEMU run
// with -no-reboot turns into an exit. It never returns: PID 1 must not exit.
func endVM() {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	fmt.Printf("init: reboot: %v; trying power off\n", err)
	err = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	fmt.Printf("init: power off: %v; halting here\n", err)
	for {
		time.Sleep(time.Hour)
	}
}
