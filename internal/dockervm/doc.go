// Package dockervm starts Docker inside a VM that runs microvm's guest
// agent, before the user's command: what exec, run and the CI executors
// do for --docker. It is the host side only; everything in the guest runs
// as shell commands through the agent (an agentvm.Runner), so the image's own
// dockerd, containerd, mount and setsid do the work.
//
// Data flow:
//
//	host, before the VM boots:
//	  CreateDisk -> internal/image.WriteDirExt4: a sparse ext4 file of the
//	     --docker-disk size (DefaultDiskSize), labelled and attached with
//	     the serial DiskSerial (Disk.Config for a Config, Disk.Arg for
//	     `run --disk`); Disk.Remove deletes it with the VM
//	host, once the agent answers (Start, each step one Runner.Run):
//	  probe:  sh -c: command -v dockerd, docker, setsid, mount; a missing
//	          one is an *Error ("the image has no dockerd; ...")
//	  ping:   docker version, once /var/run/docker.sock exists: a daemon
//	          that answers already (a second Start in the same VM) ends
//	          Start here
//	  mount:  the disk whose /sys/block/vdX/serial is DiskSerial, mounted
//	          (ext4) at /var/lib/docker: overlay2 cannot work on the
//	          image's own root, an overlay on tmpfs
//	  start:  setsid: containerd, then, once its socket exists, dockerd
//	          pointed at it; their output appended to /var/log/dockerd.log,
//	          dockerd's pid in /run/microvm-dockerd.pid; the launching
//	          shell returns once they have left its process group, which
//	          the agent kills when the shell exits
//	  wait:   ping again, with backoff from firstPoll up to maxPoll, until
//	          the daemon answers, dockerd exits, or Options.Timeout passes;
//	          the last two are an *Error carrying dockerd.log's last lines
//
// An *Error (errors.As) is Docker's failure, neither the command's nor
// microvm's: callers exit with ExitStatus. A Runner's own error (the agent
// or the VM failed) is returned wrapped, as any agent call's.
//
// Goroutines: none; Start runs in its caller's and returns when the daemon
// answers or it gives up. The guest needs cgroup v2 at /sys/fs/cgroup and
// a tmpfs /run, which the agent mounts (guest/agent/cmd/microvm-agent),
// and a kernel with what dockerd needs (docs/guest-linux.md).
package dockervm
