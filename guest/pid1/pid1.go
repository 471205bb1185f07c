//go:build linux

// Package pid1 holds what a guest's PID 1 does before its real work, shared
// by the test /init (guest/init) and the agent (guest/agent): mounting the
// kernel's file systems (the kernel mounts nothing for an initramfs root,
// not even devtmpfs) and restarting the machine at the end.
package pid1

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Mount is one file system to mount.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
}

// Basic are /proc, /sys and /dev (devtmpfs).
var Basic = []Mount{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
}

// MountAll creates each target and mounts it. A target that is already a
// mount point (EBUSY) is fine; other failures go to logf and the rest
// still run, so a guest missing one piece can still do what needs none.
func MountAll(ms []Mount, logf func(format string, args ...any)) {
	for _, m := range ms {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			logf("mkdir %s: %v", m.Target, err)
		}
		err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			logf("mount %s on %s: %v", m.FSType, m.Target, err)
		}
	}
}

// End syncs and ends the machine; it never returns (PID 1 must not exit).
// With ACPI (/sys/firmware/acpi) it powers off. Without it Linux cannot
// power off (it halts for ever), so it restarts: with reboot=k microvm sees
// the i8042 reset and exits 0; where there is no i8042 (QEMU's -M microvm)
// Linux falls back to a triple fault, which QEMU run with -no-reboot turns
// into an exit. Either way it tries the other when the first fails.
func End(logf func(format string, args ...any)) {
	// What PID 1 wrote to the console may still sit in the tty's buffer:
	// reboot does not wait for it, and the last lines would be lost.
	for _, fd := range []int{1, 2} {
		_ = unix.IoctlSetInt(fd, unix.TCSBRK, 1) // tcdrain; fails harmlessly on a non-tty
	}
	unix.Sync()
	cmds := []int{unix.LINUX_REBOOT_CMD_RESTART, unix.LINUX_REBOOT_CMD_POWER_OFF}
	if _, err := os.Stat("/sys/firmware/acpi"); err == nil {
		cmds[0], cmds[1] = cmds[1], cmds[0]
	}
	for _, c := range cmds {
		err := unix.Reboot(c)
		logf("reboot(%#x): %v", c, err)
	}
	for {
		time.Sleep(time.Hour)
	}
}
