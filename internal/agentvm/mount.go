package agentvm

import (
	"context"
)

// Disks in the guest are found by the serial the host gave them
// (microvm.DiskConfig.Serial, /sys/block/vdX/serial), never by their
// order, which depends on what else the VM has. The scripts are run with
// sh through a Runner; their variable parts are arguments ($1...), never
// spliced into the script.

// sbinPath appends the sbin directories, where Debian keeps mount and
// umount, to a PATH the image may have set without them.
const sbinPath = `PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}:/usr/local/sbin:/usr/sbin:/sbin"; export PATH
`

// mountScript ($1: the serial, $2: the directory) mounts the virtio disk
// whose serial is $1 at $2, unless it is mounted there already.
const mountScript = sbinPath + `dev=
for s in /sys/block/*/serial; do
	[ -r "$s" ] || continue
	if [ "$(cat "$s")" = "$1" ]; then d=${s%/serial}; dev=/dev/${d##*/}; fi
done
[ -n "$dev" ] || { echo "no disk with serial $1 in the guest"; exit 1; }
grep -q "^$dev $2 " /proc/mounts && exit 0
mkdir -p "$2" && mount -t ext4 "$dev" "$2"
`

// unmountScript ($1: the directory) writes the file system mounted at $1
// back to its disk and unmounts it; when the unmount fails (a process
// still has a file open there) it still syncs, and exits 1 with umount's
// message.
const unmountScript = sbinPath + `sync
umount "$1" 2>&1 && exit 0
sync
exit 1
`

// MountDisk mounts the guest's ext4 disk with the given serial at dir
// (made if missing), unless it is mounted there already. It returns the
// script's exit status and output: non-zero when there is no such disk or
// mount failed, the output saying why; err is r's own failure.
func MountDisk(ctx context.Context, r Runner, serial, dir string) (int, string, error) {
	return r.Run(ctx, []string{"sh", "-c", mountScript, "sh", serial, dir})
}

// UnmountDisk writes the file system at dir back to its disk and unmounts
// it, so that the host may keep the disk's file once the VM is gone: a
// status of 0. A non-zero status (a file still open there) still synced
// what the guest had written; the output says why.
func UnmountDisk(ctx context.Context, r Runner, dir string) (int, string, error) {
	return r.Run(ctx, []string{"sh", "-c", unmountScript, "sh", dir})
}
