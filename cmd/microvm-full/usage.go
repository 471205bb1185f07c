package main

import (
	"strings"

	"github.com/microvm/microvm"
)

// Usage lines of the commands the lean build hands over, as help lists them.
const (
	execUsage      = "run a command in a fresh VM through the guest agent"
	agentUsage     = "talk to the guest agent of a running VM through its vsock Unix socket"
	initramfsUsage = "write the guest image exec boots: the agent as /init, busybox and added files"
	mkfsUsage      = "build an ext4 disk image from a directory (mkfs.ext4 -d, from e2fsprogs)"
	vhostUserUsage = "serve the vsock device to QEMU (vhost-user-vsock-device) over vhost-user"
	connectUsage   = "connect stdin/stdout to a guest vsock port through the VM's Unix socket"
	ciUsage        = "CI executors: GitLab Runner's custom executor (ci gitlab config|prepare|run|cleanup)"
	imageUsage     = "pull, import, list and remove OCI images, the root file systems of exec --image and run --image"
)

// namedCommandNames are the named VMs' commands (named.go), with their
// usage lines.
var namedCommandNames = []struct{ name, usage string }{
	{"ls", "list the named VMs"},
	{"snapshot", "save a named VM's complete state into a directory (it goes on, or ends with --stop); microvm restore starts it again"},
	{"stop", "stop a named VM: its agent powers the guest off, or it is stopped after --timeout"},
	{"kill", "stop a named VM at once"},
	{"rm", "remove stopped named VMs (-f: stop them first)"},
	{"logs", "print a named VM's console (-f: follow it)"},
	{"cp", "copy a file into or out of a named VM: NAME:/PATH as SRC or DST"},
	{"pause", "hold a named VM's vCPUs"},
	{"resume", "let a paused VM run"},
}

// deviceSynopsis is the device flags as a usage line shows them.
func deviceSynopsis() string {
	var s []string
	for _, f := range microvm.DeviceFlags() {
		s = append(s, f.Synopsis)
	}
	return strings.Join(append(s, "[--metrics-socket PATH]"), " ")
}
