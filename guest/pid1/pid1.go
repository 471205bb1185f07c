//go:build linux

// Package pid1 holds what a guest's PID 1 does before its real work, shared
// by the test /init (guest/init) and the agent (guest/agent): mounting the
// kernel's file systems (the kernel mounts nothing for an initramfs root,
// not even devtmpfs), loading the kernel modules an image lists (for
// distribution kernels, whose virtio drivers are modules), naming the DNS
// servers the kernel learnt by DHCP, and ending the machine: powering off
// where ACPI can, else restarting.
package pid1

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
// Where ACPI can power off (CanPowerOff) it powers off: microvm exits 0.
// Otherwise Linux would only halt for ever, so it restarts: with reboot=k
// microvm sees the i8042 reset and exits 0; where there is no i8042 (QEMU's
// -M microvm) Linux falls back to a triple fault, which QEMU run with
// -no-reboot turns into an exit. Either way it tries the other when the
// first fails.
func End(logf func(format string, args ...any)) {
	// What PID 1 wrote to the console may still sit in the tty's buffer:
	// reboot does not wait for it, and the last lines would be lost.
	for _, fd := range []int{1, 2} {
		_ = unix.IoctlSetInt(fd, unix.TCSBRK, 1) // tcdrain; fails harmlessly on a non-tty
	}
	unix.Sync()
	cmds := []int{unix.LINUX_REBOOT_CMD_RESTART, unix.LINUX_REBOOT_CMD_POWER_OFF}
	if CanPowerOff() {
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

// DSDTPath is where Linux shows the firmware's DSDT.
const DSDTPath = "/sys/firmware/acpi/tables/DSDT"

// CanPowerOff says whether the kernel can power the machine off: it runs
// with ACPI and the DSDT defines the \_S5 sleep state, which is what Linux
// needs to install its ACPI power-off handler. Without that,
// reboot(LINUX_REBOOT_CMD_POWER_OFF) halts for ever ("reboot: System
// halted") and never returns.
func CanPowerOff() bool {
	b, err := os.ReadFile(DSDTPath)
	return err == nil && HasS5(b)
}

// HasS5 says whether AML (a DSDT) names \_S5: the NameSeg "_S5_" appears
// in any definition of it.
func HasS5(aml []byte) bool { return bytes.Contains(aml, []byte("_S5_")) }

// ModuleOrder is the file that lists, one path a line in load order, the
// kernel modules PID 1 loads before anything else (LoadModules). An image
// for a kernel with built-in drivers has none.
const ModuleOrder = "/lib/modules/load.order"

// LoadModules loads each module listed in the file at path (ModuleOrder),
// in order, with finit_module and no parameters; a module already loaded
// (EEXIST) counts as loaded. A missing file means there is nothing to load.
// Failures go to logf and the rest are still tried; it returns how many
// loaded.
func LoadModules(path string, logf func(format string, args ...any)) int {
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logf("modules: %v", err)
		}
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		p := strings.TrimSpace(line)
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			logf("module %s: %v", p, err)
			continue
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			logf("module %s: finit_module: %v", p, err)
			continue
		}
		logf("module %s loaded", p)
		n++
	}
	return n
}

// PNP is where the kernel lists what its IP autoconfiguration (ip=dhcp on
// the command line, as microvm's --net user adds) learnt, DNS servers
// among it, in resolv.conf's syntax.
const PNP = "/proc/net/pnp"

// LinkResolvConf makes /etc/resolv.conf a link to PNP when the kernel
// configured a network by DHCP and the root file system has no
// resolv.conf of its own; it reports whether it made the link. /proc must
// be mounted.
func LinkResolvConf(logf func(format string, args ...any)) bool {
	return linkResolvConf(PNP, "/etc/resolv.conf", logf)
}

func linkResolvConf(pnp, resolv string, logf func(format string, args ...any)) bool {
	b, err := os.ReadFile(pnp)
	if err != nil || !bytes.Contains(b, []byte("nameserver")) {
		return false
	}
	if _, err := os.Lstat(resolv); err == nil {
		return false
	}
	if err := os.MkdirAll(filepath.Dir(resolv), 0o755); err != nil {
		logf("resolv.conf: %v", err)
		return false
	}
	if err := os.Symlink(pnp, resolv); err != nil {
		logf("resolv.conf: %v", err)
		return false
	}
	return true
}

// LinkUp sets IFF_UP on a network interface (SIOCGIFFLAGS, SIOCSIFFLAGS).
func LinkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("link %s up: socket: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("link %s up: get flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("link %s up: set flags: %w", name, err)
	}
	return nil
}
