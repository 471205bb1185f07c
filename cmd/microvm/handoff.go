package main

// The CLI has two builds. The full build of this package (go build
// ./cmd/microvm, go install, the tests) holds every command. `make` builds
// two binaries from it: bin/microvm-full, the full build, and bin/microvm,
// the lean build (tags microvm_lean and urfave_cli_no_docs), which holds
// `run` and `version` and hands every other command line over to
// microvm-full (lean.go): exec and agent, the guest image tools initramfs
// and mkfs, vhost-user-vsock and vsock-connect. So `microvm run` neither
// links nor initialises what only they use (gRPC, protobuf, whose detrand
// reads the executable at start-up, the cpio, gzip and ELF readers, the
// vhost-user back-end, urfave/cli's man-page generator), and the user
// still types `microvm exec`. docs/benchmarks.md ("Start-up") measures
// both.

// Usage lines of the handed-over commands, the same in both builds.
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

// namedCommandNames are the named VMs' commands (named.go), with the
// usage lines both builds show.
var namedCommandNames = []struct{ name, usage string }{
	{"ls", "list the named VMs"},
	{"stop", "stop a named VM: its agent powers the guest off, or it is stopped after --timeout"},
	{"kill", "stop a named VM at once"},
	{"rm", "remove stopped named VMs (-f: stop them first)"},
	{"logs", "print a named VM's console (-f: follow it)"},
	{"cp", "copy a file into or out of a named VM: NAME:/PATH as SRC or DST"},
	{"pause", "hold a named VM's vCPUs"},
	{"resume", "let a paused VM run"},
}
