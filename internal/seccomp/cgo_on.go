//go:build cgo

package seccomp

import "golang.org/x/sys/unix"

// cgoRules are what glibc needs in a cgo build (go build without
// CGO_ENABLED=0, and every -race build), where pthread_create makes the
// process's threads: clone with its flags (after clone3 failed), each new
// thread registering with the kernel, and malloc sizing its arenas the
// first time a thread frees memory, which reads
// /sys/devices/system/cpu/online with every signal blocked. A SIGSYS to a
// thread that blocks it kills silently, so openat fails with EACCES here
// instead (glibc then counts CPUs with sched_getaffinity). microvm's
// release build (make bin/microvm) is static, CGO_ENABLED=0, and has none
// of these rules: there an open ends the process with a report.
func cgoRules() []rule {
	return []rule{
		fail(unix.SYS_OPENAT, unix.EACCES, "cgo builds: glibc malloc reading /sys/devices/system/cpu/online, signals blocked"),
		allow(unix.SYS_SET_ROBUST_LIST, "cgo builds: each glibc thread's start"),
		allow(unix.SYS_RSEQ, "cgo builds: each glibc thread's start"),
	}
}

// cgoThreadFlags are the clone flags of glibc's threads.
var cgoThreadFlags = []uint32{glibcThreadCloneFlags}
