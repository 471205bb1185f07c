package seccomp

import (
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm"
)

// The policies below were found by reading what each part calls (the Go
// runtime's sys_linux_amd64.s and internal/runtime/syscall, x/sys/unix and
// net calls in microvm's packages) and checked by running microvm under
// strace -f with the test guest moving vsock data both ways, a disk and
// the rng device (docs/security.md). Each rule says who needs it. One
// allow-list covers every thread of the process: Go does not pin a
// goroutine to a thread (a vCPU's goroutine is locked to its thread, but
// device workers, the netpoller and the runtime's own threads move
// between threads freely), so a per-thread-kind list would not be simple
// to keep right.

// threadCloneFlags are the flags the Go runtime creates every thread with
// (runtime.cloneFlags plus the CLONE_SETTLS its clone adds), and
// glibcThreadCloneFlags those of glibc's pthread_create, which creates the
// threads of a cgo build (it tries clone3 first, and falls back to clone
// on ENOSYS). clone with anything else, a fork or vfork among them, is
// forbidden.
const (
	threadCloneFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD | unix.CLONE_SETTLS
	glibcThreadCloneFlags = threadCloneFlags | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
)

// prSetVMA and prSetVMAAnonName: the one prctl the Go runtime makes at run
// time (Go 1.25+ names its anonymous mappings).
const (
	prSetVMA         = 0x53564d41 // PR_SET_VMA
	prSetVMAAnonName = 0          // PR_SET_VMA_ANON_NAME
)

// goRuntime is what the Go runtime and standard library call on their own:
// threads, signals, memory, the scheduler's sleeps and wake-ups, the
// netpoller, timers, GOMAXPROCS updates. pid is the process's own: signals
// go only to its own threads.
func goRuntime(pid int) []rule {
	self := uint32(pid)
	rules := []rule{
		allow(unix.SYS_FUTEX, "runtime: locks, sleeping Ms, notes"),
		allow(unix.SYS_EPOLL_PWAIT, "runtime netpoller"),
		allow(unix.SYS_EPOLL_PWAIT2, "runtime netpoller (newer runtimes)"),
		allow(unix.SYS_EPOLL_WAIT, "x/sys/unix EpollWait"),
		allow(unix.SYS_EPOLL_CTL, "netpoller: registering descriptors"),
		allow(unix.SYS_EPOLL_CREATE1, "eventfd.PollStop and new pollers"),
		allow(unix.SYS_EVENTFD2, "device workers' stop eventfds, netpoll wake-up"),
		allow(unix.SYS_NANOSLEEP, "runtime usleep (sysmon, spinning)"),
		allow(unix.SYS_CLOCK_NANOSLEEP, "sleeps"),
		allow(unix.SYS_CLOCK_GETTIME, "vDSO fallback"),
		allow(unix.SYS_SCHED_YIELD, "runtime osyield"),
		allow(unix.SYS_SCHED_GETAFFINITY, "runtime: GOMAXPROCS updates"),
		allow(unix.SYS_READ, "every descriptor read"),
		allow(unix.SYS_WRITE, "every descriptor written, console, eventfd signals"),
		allow(unix.SYS_CLOSE, "closing descriptors"),
		allow(unix.SYS_FCNTL, "net and os: descriptor flags, F_DUPFD_CLOEXEC"),
		allow(unix.SYS_PREAD64, "runtime: cgroup CPU limit re-read for GOMAXPROCS; disks"),
		allowIf(unix.SYS_MMAP, "runtime heap and stacks; never executable", argClear(2, unix.PROT_EXEC)),
		allowIf(unix.SYS_MPROTECT, "runtime sysFault; never executable", argClear(2, unix.PROT_EXEC)),
		allow(unix.SYS_MUNMAP, "runtime, guest memory at teardown"),
		allow(unix.SYS_MADVISE, "runtime scavenger"),
		allowIf(unix.SYS_PRCTL, "runtime: naming anonymous mappings",
			argIn(0, prSetVMA), argIn(1, prSetVMAAnonName)),
		allow(unix.SYS_GETRANDOM, "runtime, crypto/rand, the rng device"),
		allow(unix.SYS_RT_SIGACTION, "runtime and os/signal"),
		allow(unix.SYS_RT_SIGPROCMASK, "runtime: thread creation, signal masks"),
		allow(unix.SYS_RT_SIGRETURN, "return from every signal handler"),
		allow(unix.SYS_SIGALTSTACK, "runtime: each new thread's signal stack"),
		allow(unix.SYS_RESTART_SYSCALL, "the kernel restarting a sleep a signal interrupted"),
		allowIf(unix.SYS_CLONE, "new threads (the Go runtime's; glibc's in cgo builds), and nothing else",
			arg64In(0, append([]uint32{threadCloneFlags}, cgoThreadFlags...)...)...),
		fail(unix.SYS_CLONE3, unix.ENOSYS, "its flags are in memory, out of a filter's reach; ENOSYS makes glibc fall back to clone, which the rule above judges"),
		allow(unix.SYS_GETTID, "runtime, vCPU Kick"),
		allow(unix.SYS_GETPID, "runtime, vCPU Kick"),
		allowIf(unix.SYS_TGKILL, "runtime preemption, vCPU Kick: own threads only", argIn(0, self)),
		allowIf(unix.SYS_KILL, "runtime: raising a fatal signal on itself", argIn(0, self)),
		allow(unix.SYS_UNAME, "runtime and internal/syscall/unix kernel version checks"),
		allow(unix.SYS_EXIT, "a thread ending"),
		allow(unix.SYS_EXIT_GROUP, "the process ending"),
	}
	return append(rules, cgoRules()...)
}

// unixSockets are the host's vsock side at run time: accepting host
// clients on the device's sockets, connecting guest-initiated connections
// to <uds>_<port> (socket and connect, Unix domain only), the byte streams
// and records themselves, and removing the socket files at teardown.
func unixSockets() []rule {
	return append([]rule{
		allowIf(unix.SYS_SOCKET, "vsock: guest connections to <uds>_<port>", argIn(0, unix.AF_UNIX)),
		allowIf(unix.SYS_SETSOCKOPT, "vsock: the host sockets' send buffer (Options.SendBuffer)",
			argIn(1, unix.SOL_SOCKET), argIn(2, unix.SO_SNDBUF))},
		socketCalls()...)
}

// socketCalls are what every socket needs once created; unixSockets and
// ipSockets add the socket call itself.
func socketCalls() []rule {
	return []rule{
		allow(unix.SYS_CONNECT, "vsock: guest connections to <uds>_<port>"),
		allowIf(unix.SYS_SOCKETPAIR, "vsock: Machine.DialVsock and ListenVsock (Go API)", argIn(0, unix.AF_UNIX)),
		allow(unix.SYS_ACCEPT4, "vsock: host clients on <uds>"),
		allow(unix.SYS_GETSOCKNAME, "net: accepted and dialled connections"),
		allow(unix.SYS_GETPEERNAME, "net: dialled connections"),
		allow(unix.SYS_GETSOCKOPT, "net: SO_ERROR after a non-blocking connect"),
		allow(unix.SYS_READV, "vsock RX: host socket into guest buffers"),
		allow(unix.SYS_WRITEV, "vsock, net TX: guest buffers to host"),
		allow(unix.SYS_SENDMSG, "vsock SEQPACKET and datagrams"),
		allow(unix.SYS_RECVMSG, "vsock SEQPACKET and datagrams"),
		allow(unix.SYS_SENDTO, "datagrams"),
		allow(unix.SYS_RECVFROM, "datagrams"),
		allow(unix.SYS_SHUTDOWN, "vsock half-close"),
		allow(unix.SYS_POLL, "device workers"),
		allow(unix.SYS_PPOLL, "device workers (x/sys/unix Poll)"),
		allow(unix.SYS_UNLINKAT, "removing <uds> and <uds>.seqpacket at teardown"),
	}
}

// ioctls allows ioctl with the given requests only.
func ioctls(why string, requests ...uint32) rule {
	return allowIf(unix.SYS_IOCTL, why, argIn(1, requests...))
}

// Non-KVM ioctl requests made at run time.
const (
	reqFIONREAD   = unix.SIOCINQ       // vsock: is a SEQPACKET peer's queue empty (hostSeqEOF)
	reqTCGETS     = unix.TCGETS        // logrus: is stderr a terminal (its first message)
	reqTUNOffload = unix.TUNSETOFFLOAD // virtio-net: the guest's offloads, at activation
)

// ipSockets are the user-mode network's (devices/virtionet/usernet, in
// the microvm-net process): the stack re-originates the guest's TCP
// connections and UDP flows, and its DNS server's lookups, with the
// host's own IPv4 and IPv6 sockets (socket, connect, setsockopt: Go sets
// TCP_NODELAY and SO_BROADCAST on what it creates), and accepts on the
// published ports. Go's resolver checks /etc/resolv.conf, nsswitch.conf
// and hosts for changes every five seconds: stat is allowed, and opening
// one again (after it changed) fails with EACCES, which leaves the
// resolver with what it read before the filter (microvm-net looks a name
// up first) or its defaults. Still no bind or listen: the published ports
// are bound before Install.
func ipSockets() []rule {
	rules := []rule{
		allowIf(unix.SYS_SOCKET, "the user-mode network's egress (IPv4, IPv6)",
			argIn(0, unix.AF_UNIX, unix.AF_INET, unix.AF_INET6)),
		allow(unix.SYS_SETSOCKOPT, "net: TCP_NODELAY, SO_BROADCAST on the egress sockets"),
		allow(unix.SYS_NEWFSTATAT, "net: the resolver's checks of /etc/resolv.conf and /etc/hosts"),
	}
	if !hasRule(cgoRules(), unix.SYS_OPENAT) { // a cgo build fails it already
		rules = append(rules, fail(unix.SYS_OPENAT, unix.EACCES, "net: the resolver re-reading a changed /etc/resolv.conf: refused, not fatal"))
	}
	return append(rules, socketCalls()...)
}

func hasRule(rules []rule, nr int) bool {
	for _, r := range rules {
		if r.nr == nr {
			return true
		}
	}
	return false
}

// VMM is the allow-list of `microvm run` and `microvm exec` once the
// machine is built: the Go runtime, KVM_RUN and the few other KVM requests
// a running machine makes (kvm.RuntimeIoctls), the devices' I/O on
// descriptors they already hold (disk images, TAPs, eventfds), and Unix
// sockets for vsock. It allows no open, no exec, no fork, no new network
// sockets, no bind or listen, no file creation or permission change, no
// ptrace, no mount: a guest that took over the VMM process gets none of
// those. Building the machine (opening /dev/kvm, files, TAPs, binding the
// vsock sockets) is done before Install.
func VMM() Policy { return vmm("microvm", unixSockets()) }

// VMMUserNet is VMM for a machine on a user-mode network, whose network
// runs in a child process (microvm-net): VMM's calls, and reaping that
// child (waitid, wait4) or, when it does not end, killing it through its
// pidfd (pidfd_send_signal reaches only the process the pidfd names).
func VMMUserNet() Policy {
	p := vmm("microvm --net user", unixSockets())
	p.rules = append(p.rules,
		allow(unix.SYS_WAITID, "--net user: reaping microvm-net (os.Process.Wait with a pidfd)"),
		allow(unix.SYS_WAIT4, "--net user: reaping microvm-net (without a pidfd)"),
		allow(unix.SYS_PIDFD_SEND_SIGNAL, "--net user: killing microvm-net when it does not end"),
	)
	return p
}

// UserNet is the allow-list of microvm-net, the process of a user-mode
// network (cmd/microvm-net), once its published ports are bound: the Go
// runtime and the network's sockets (ipSockets). No KVM, no open, no
// exec, no bind or listen.
func UserNet() Policy {
	rules := []rule{ioctls("logrus: is stderr a terminal", reqTCGETS)}
	rules = append(rules, goRuntime(os.Getpid())...)
	rules = append(rules, ipSockets()...)
	return Policy{name: "microvm-net", rules: rules}
}

func vmm(name string, sockets []rule) Policy {
	req := append(kvm.RuntimeIoctls(), reqFIONREAD, reqTCGETS, reqTUNOffload)
	rules := []rule{ioctls("KVM_RUN first: it is the hottest call", req...)}
	rules = append(rules, goRuntime(os.Getpid())...)
	rules = append(rules, sockets...)
	rules = append(rules,
		allow(unix.SYS_PWRITE64, "disks"),
		allow(unix.SYS_PREADV, "disks: reads into guest buffers"),
		allow(unix.SYS_PWRITEV, "disks: writes from guest buffers"),
		allow(unix.SYS_FDATASYNC, "disks: the guest's flush"),
		allow(unix.SYS_FALLOCATE, "disks: discard and write-zeroes punch holes"),
		allow(unix.SYS_FTRUNCATE, "named VMs: emptying the console file that takes over (internal/vms)"),
	)
	return Policy{name: name, rules: rules}
}

// VhostUserVsock is the allow-list of `microvm vhost-user-vsock` once its
// sockets are listening: the Go runtime, the vsock device's Unix sockets,
// and what serving a front-end takes: accepting it again after it
// reconnects, receiving its memory and eventfds (recvmsg), checking and
// mapping each memory region (fstat, F_GET_SEALS, mmap MAP_SHARED), and
// telling an eventfd from other descriptors (readlink of /proc/self/fd/N,
// so /proc must be mounted). No KVM requests.
func VhostUserVsock() Policy {
	rules := []rule{ioctls("vsock, logrus", reqFIONREAD, reqTCGETS)}
	rules = append(rules, goRuntime(os.Getpid())...)
	rules = append(rules, unixSockets()...)
	rules = append(rules,
		allow(unix.SYS_FSTAT, "vhost-user: checking a memory region's file"),
		allow(unix.SYS_READLINKAT, "vhost-user: /proc/self/fd/N of a kick or call descriptor"),
	)
	return Policy{name: "microvm vhost-user-vsock", rules: rules}
}

// WithSnapshots is p plus what saving a snapshot of the running machine
// takes (internal/snapshot, internal/vmm's SaveSnapshot): KVM's state
// reads (kvm.SnapshotIoctls, added to p's ioctl requests), and making the
// snapshot's directory and files beside the target, syncing them and
// renaming the directory into place (or exchanging it with the snapshot it
// replaces, which is then removed). A named VM, which its control API may
// ask for a snapshot, runs under it: the price is that a subverted
// process may create and remove files where the VMM's user can.
func (p Policy) WithSnapshots() Policy {
	rules := append([]rule(nil), p.rules...)
	for i, r := range rules {
		if r.nr == unix.SYS_IOCTL && len(r.args) == 1 {
			c := r.args[0]
			c.values = append(append([]uint32(nil), c.values...), kvm.SnapshotIoctls()...)
			rules[i].args = []cond{c}
			rules[i].why += "; snapshots: KVM's state reads"
		}
	}
	rules = withRules(rules,
		allow(unix.SYS_OPENAT, "snapshots: the directory and its files"),
		allow(unix.SYS_MKDIRAT, "snapshots: the temporary directory"),
		allow(unix.SYS_FSYNC, "snapshots: each file, the directory and its parent"),
		allow(unix.SYS_RENAMEAT, "snapshots: the directory into place"),
		allow(unix.SYS_RENAMEAT2, "snapshots: exchanged with the snapshot it replaces"),
		allow(unix.SYS_UNLINKAT, "snapshots: removing a failed or replaced one"),
		allow(unix.SYS_GETDENTS64, "snapshots: removing a failed or replaced one"),
		allow(unix.SYS_FSTAT, "snapshots: os.File"),
		allow(unix.SYS_NEWFSTATAT, "snapshots: the target's checks"),
		allow(unix.SYS_LSEEK, "snapshots: os.File"),
		allow(unix.SYS_FCHMODAT, "snapshots: 0700 directory"),
	)
	return Policy{name: p.name + " (snapshots)", rules: rules}
}

// WithShares is p plus the file calls of a shared directory's 9P server
// (devices/virtio9p, --share): walking and opening below the share's root
// descriptor, making, renaming and removing entries, their attributes.
// Seccomp cannot see paths: the server's own confinement (descriptor
// walks, no symlink followed) keeps the guest inside the share, and the
// filter only bounds which calls a subverted process could make.
func (p Policy) WithShares() Policy {
	rules := withRules(append([]rule(nil), p.rules...),
		allow(unix.SYS_OPENAT, "--share: walking (O_PATH|O_NOFOLLOW), opening and creating files"),
		allow(unix.SYS_FSTAT, "--share: a file's attributes"),
		allow(unix.SYS_NEWFSTATAT, "--share: an entry's attributes (AT_SYMLINK_NOFOLLOW)"),
		allow(unix.SYS_FSTATFS, "--share: statfs"),
		allow(unix.SYS_GETDENTS64, "--share: listing a directory"),
		allow(unix.SYS_LSEEK, "--share: rewinding a directory"),
		allow(unix.SYS_DUP, "--share: a walk starting from a file"),
		allow(unix.SYS_MKDIRAT, "--share: mkdir"),
		allow(unix.SYS_SYMLINKAT, "--share: symlink (stored, never followed)"),
		allow(unix.SYS_LINKAT, "--share: hard links to regular files"),
		allow(unix.SYS_RENAMEAT, "--share: rename"),
		allow(unix.SYS_UNLINKAT, "--share: unlink and rmdir"),
		allow(unix.SYS_FCHOWNAT, "--share: owners"),
		allow(unix.SYS_FCHMODAT, "--share: permissions"),
		allow(unix.SYS_TRUNCATE, "--share: sizes"),
		allow(unix.SYS_UTIMENSAT, "--share: times"),
		allow(unix.SYS_READLINKAT, "--share: reading a symlink"),
		allow(unix.SYS_FSYNC, "--share: the guest's fsync"),
		allow(unix.SYS_GETEUID, "--share: whether new files can take the guest's owner"),
	)
	return Policy{name: p.name + " (shares)", rules: rules}
}

// WithCacheCommits is p plus what keeping a job's disks after its VM is
// gone takes (exec --cache and --docker, internal/cachedisk): syncing a
// cache clone and renaming it into place as the next version under the
// cache's lock, writing its manifest, evicting old versions, and removing
// Docker's data disk, discarded clones and the abandoned clones killed
// jobs left (probed with a flock). Like WithSnapshots, the price
// is that a subverted process may create and remove files where the
// VMM's user can.
func (p Policy) WithCacheCommits() Policy {
	rules := withRules(append([]rule(nil), p.rules...),
		allow(unix.SYS_OPENAT, "caches: the clone, the manifest, the lock and the store's directories"),
		allow(unix.SYS_MKDIRAT, "caches: a name's directory"),
		allow(unix.SYS_FSYNC, "caches: the clone, the manifest and the directory"),
		allow(unix.SYS_FLOCK, "caches: a name's lock; whether a VM holds a clone"),
		allow(unix.SYS_RENAMEAT, "caches: the clone and manifest into place"),
		allow(unix.SYS_UNLINKAT, "caches: evicted versions, discarded and abandoned clones, Docker's data disk"),
		allow(unix.SYS_GETDENTS64, "caches: listing a name's versions"),
		allow(unix.SYS_FSTAT, "caches: os.File"),
		allow(unix.SYS_NEWFSTATAT, "caches: a version's size and allocation"),
		allow(unix.SYS_LSEEK, "caches: os.File"),
		allow(unix.SYS_PREAD64, "caches: checking a clone's ext4 superblock"),
		allow(unix.SYS_READ, "caches: a version's manifest"),
		allow(unix.SYS_FCHMOD, "caches: the manifest's mode (internal/atomicfile)"),
	)
	return Policy{name: p.name + " (caches)", rules: rules}
}

// withRules adds extra to rules: a call rules already allows outright
// stays as it is; one rules fails with an errno (openat: the resolver's
// re-read of /etc/resolv.conf) is now allowed instead.
func withRules(rules []rule, extra ...rule) []rule {
	for _, r := range extra {
		rules = slices.DeleteFunc(rules, func(old rule) bool { return old.nr == r.nr && old.errno != 0 })
		if !hasRule(rules, r.nr) {
			rules = append(rules, r)
		}
	}
	return rules
}

// WithCPUProfiling is p plus what the Go runtime's CPU profiler calls
// (--cpuprofile): each thread's profiling timer (timer_create,
// timer_settime, timer_delete, set as threads run) and the process's
// (setitimer). The profile itself is written to a descriptor opened
// before the filter. runtime/pprof's writer goroutine also reads
// /proc/self/maps when it starts, which may be after the filter is on:
// that openat fails with EACCES rather than ending the process, and the
// profile then carries one faked mapping (functions are named in the
// profile itself, so it still reads whole).
func (p Policy) WithCPUProfiling() Policy {
	rules := append([]rule(nil), p.rules...)
	rules = append(rules,
		allow(unix.SYS_TIMER_CREATE, "--cpuprofile: a thread's profiling timer"),
		allow(unix.SYS_TIMER_SETTIME, "--cpuprofile: a thread's profiling timer"),
		allow(unix.SYS_TIMER_DELETE, "--cpuprofile: a thread's profiling timer"),
		allow(unix.SYS_SETITIMER, "--cpuprofile: the process's profiling timer"),
	)
	if !hasRule(rules, unix.SYS_OPENAT) {
		rules = append(rules, fail(unix.SYS_OPENAT, unix.EACCES, "--cpuprofile: runtime/pprof's /proc/self/maps, refused without ending the process"))
	}
	return Policy{name: p.name + " (CPU profiling)", rules: rules}
}
