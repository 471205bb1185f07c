package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/seccomp"
)

// Exit statuses of a set-up step that fails, as a shell's: 127 when the
// program is not found, 126 for every other reason (the message is on
// stderr).
const (
	exitNotFound  = 127
	exitCannotRun = 126
)

// ContainerInit is the set-up step of a container process (see
// startInContainer): it reads its ExecStart from initSpecFd, enters or
// creates the container, applies the process's limits, capabilities and
// credentials, and execs the program. It never returns: on failure it
// writes one line to stderr and exits 126, or 127 for a program not found.
func ContainerInit() {
	// Capabilities, PR_SET_KEEPCAPS and no_new_privs belong to a thread:
	// they are set on this one, which then calls execve.
	runtime.LockOSThread()
	// The ready pipe closes when execve succeeds (or this process exits):
	// the agent waits for that before it reports the process started.
	unix.CloseOnExec(initReadyFd)
	st, err := readSpec()
	if err == nil {
		err = enterContainer(st)
	}
	var (
		argv0 string
		env   []string
	)
	// The container's seccomp filter: without no_new_privs the kernel
	// takes it only from a thread with CAP_SYS_ADMIN, so it goes in before
	// setupProcess drops the capabilities (and then filters set-up's own
	// calls, as under runc); with no_new_privs it goes in last.
	early := st.Seccomp != nil && !st.NoNewPrivileges
	if err == nil && early {
		err = seccomp.InstallProgram(st.Seccomp.Program, st.Seccomp.Flags)
	}
	if err == nil {
		argv0, env, err = setupProcess(st)
	}
	if err == nil && st.Seccomp != nil && !early {
		err = seccomp.InstallProgram(st.Seccomp.Program, st.Seccomp.Flags)
	}
	if err == nil {
		err = syscall.Exec(argv0, st.Argv, env)
		err = fmt.Errorf("exec %q: %w", st.Argv[0], err)
	}
	fmt.Fprintf(os.Stderr, "microvm-agent: container %s: %v\n", st.GetContainer().GetId(), err)
	if errors.Is(err, errNotExecutable) || errors.Is(err, unix.ENOENT) {
		os.Exit(exitNotFound)
	}
	os.Exit(exitCannotRun)
}

func readSpec() (*agentapi.ExecStart, error) {
	f := os.NewFile(initSpecFd, "spec")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 2*(MaxArgvBytes+MaxEnvBytes)+1<<20))
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	st := &agentapi.ExecStart{}
	if err := proto.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if st.Container == nil {
		return nil, errors.New("the spec names no container")
	}
	return st, nil
}

// enterContainer creates the container (this process is its init, in new
// namespaces) or joins it: the agent has entered its PID, UTS, IPC and
// cgroup namespaces; this process enters its mount namespace, passed on
// initMntFd, so that it sees the container's mounts as its init does
// (/proc/self/mounts, df, mount included) and mounts it makes are the
// container's. The kernel refuses that setns to a thread that shares its
// root and working directory with others, as every Go thread does: this
// one (locked, the one that will execve) stops sharing them first. setns
// then puts its root and working directory at the namespace's root: the
// container's, where its init pivoted.
func enterContainer(st *agentapi.ExecStart) error {
	if r := st.Container.Create; r != nil {
		return createRoot(st.Container.Id, r)
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("enter the mount namespace: unshare CLONE_FS: %w", err)
	}
	if err := unix.Setns(initMntFd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the mount namespace: %w", err)
	}
	unix.Close(initMntFd)
	return nil
}

// createRoot builds the container's file system in this process's new
// mount namespace (and cgroup namespace, if asked): the root bound (alone,
// without the mounts below it) on a
// directory of its own, the spec's mounts below it, devices when /dev is a
// tmpfs; then pivot_root into it, read-only if asked, and the hostname.
func createRoot(id string, r *agentapi.ContainerRoot) error {
	if r.GetNamespaces().GetCgroup() {
		// Now that this process is in the container's cgroup (the agent
		// cloned it into it), so that the new namespace's root is that
		// cgroup; before the mounts, so a cgroup2 mount shows only it.
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("cgroup namespace: %w", err)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	target := filepath.Join(containerDirBase, id, "root")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(r.Root, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind root %s: %w", r.Root, err)
	}
	devTmpfs := false
	for _, m := range r.Mounts {
		if err := mountIn(target, m); err != nil {
			return err
		}
		if path.Clean(m.Destination) == "/dev" && m.Type == "tmpfs" {
			devTmpfs = true
		}
	}
	if devTmpfs {
		if err := populateDev(target); err != nil {
			return err
		}
	}
	if err := unix.Chdir(target); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if r.Readonly {
		if err := unix.Mount("", "/", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make / read-only: %w", err)
		}
	}
	if err := maskPaths(r.MaskedPaths); err != nil {
		return err
	}
	if err := readonlyPaths(r.ReadonlyPaths); err != nil {
		return err
	}
	if r.Hostname != "" && r.GetNamespaces().GetUts() == agentapi.NamespaceMode_NAMESPACE_NEW {
		if err := unix.Sethostname([]byte(r.Hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	return nil
}

// maskPaths hides each path, as runc does: a file behind /dev/null, a
// directory (binding a file on it is ENOTDIR) behind an empty read-only
// tmpfs. It runs after pivot_root, so the paths, symbolic links included,
// resolve inside the container's root. A missing path is skipped.
func maskPaths(paths []string) error {
	for _, p := range paths {
		err := unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		if errors.Is(err, unix.ENOTDIR) {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	return nil
}

// readonlyPaths binds each path on itself and makes that read-only
// (after pivot_root, like maskPaths). A missing path is skipped.
func readonlyPaths(paths []string) error {
	for _, p := range paths {
		err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, "")
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err == nil {
			err = unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, "")
		}
		if err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
	}
	return nil
}

// optionalFS are file systems the guest kernel may lack; their mounts are
// skipped then, as the container can run without them.
var optionalFS = map[string]bool{"cgroup": true, "cgroup2": true, "mqueue": true}

// mountIn makes m below root.
func mountIn(root string, m *agentapi.Mount) error {
	flags, data := mountOptions(m.Options)
	bind := m.Type == "bind" || flags&unix.MS_BIND != 0
	dest, err := resolveIn(root, m.Destination, bind && !isDir(m.Source))
	if err != nil {
		return fmt.Errorf("mount %s: %w", m.Destination, err)
	}
	if bind {
		if err := unix.Mount(m.Source, dest, "", flags&(unix.MS_BIND|unix.MS_REC)|unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount %s: bind %s: %w", m.Destination, m.Source, err)
		}
		if rest := flags &^ (unix.MS_BIND | unix.MS_REC); rest != 0 {
			if err := unix.Mount("", dest, "", unix.MS_BIND|unix.MS_REMOUNT|rest, ""); err != nil {
				return fmt.Errorf("mount %s: remount: %w", m.Destination, err)
			}
		}
		return nil
	}
	fstype := m.Type
	if fstype == "cgroup" {
		fstype = "cgroup2" // the guest has the unified hierarchy only
	}
	src := m.Source
	if src == "" {
		src = fstype
	}
	err = unix.Mount(src, dest, fstype, flags, data)
	if err != nil && optionalFS[m.Type] && (errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mount %s (%s): %w", m.Destination, m.Type, err)
	}
	return nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// mountFlags are the mount(8) options that are flags; the propagation ones
// map to nothing, since every mount of a container is private.
var mountFlags = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY}, "rw": {true, unix.MS_RDONLY},
	"nosuid": {false, unix.MS_NOSUID}, "suid": {true, unix.MS_NOSUID},
	"nodev": {false, unix.MS_NODEV}, "dev": {true, unix.MS_NODEV},
	"noexec": {false, unix.MS_NOEXEC}, "exec": {true, unix.MS_NOEXEC},
	"sync": {false, unix.MS_SYNCHRONOUS}, "async": {true, unix.MS_SYNCHRONOUS},
	"noatime": {false, unix.MS_NOATIME}, "atime": {true, unix.MS_NOATIME},
	"nodiratime": {false, unix.MS_NODIRATIME}, "diratime": {true, unix.MS_NODIRATIME},
	"relatime": {false, unix.MS_RELATIME}, "norelatime": {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME}, "nostrictatime": {true, unix.MS_STRICTATIME},
	"bind": {false, unix.MS_BIND}, "rbind": {false, unix.MS_BIND | unix.MS_REC},
	"private": {}, "rprivate": {}, "shared": {}, "rshared": {}, "slave": {}, "rslave": {},
	"unbindable": {}, "runbindable": {},
}

// mountOptions splits options into mount(2) flags and the data string.
func mountOptions(opts []string) (flags uintptr, data string) {
	var rest []string
	for _, o := range opts {
		f, ok := mountFlags[o]
		switch {
		case !ok:
			rest = append(rest, o)
		case f.clear:
			flags &^= f.flag
		default:
			flags |= f.flag
		}
	}
	return flags, strings.Join(rest, ",")
}

// maxSymlinks bounds the symbolic links resolveIn follows, as the kernel's
// limit on a path walk does.
const maxSymlinks = 40

// resolveIn returns the host path of p inside root, following symbolic
// links as if root were / (an image cannot point a mount outside its
// root), and creating what is missing: directories, and the last element
// as an empty file when file is set (a bind mount of a file).
func resolveIn(root, p string, file bool) (string, error) {
	rest := strings.Split(p, "/")
	cur := "/"
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		host := filepath.Join(root, next)
		fi, err := os.Lstat(host)
		switch {
		case err == nil && fi.Mode()&os.ModeSymlink != 0:
			links++
			if links > maxSymlinks {
				return "", unix.ELOOP
			}
			t, err := os.Readlink(host)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(t, "/") {
				cur = "/"
			}
			rest = append(strings.Split(t, "/"), rest...)
			continue
		case errors.Is(err, os.ErrNotExist):
			if file && lastElement(rest) {
				f, err := os.OpenFile(host, os.O_CREATE|os.O_WRONLY, 0o644)
				if err != nil {
					return "", err
				}
				f.Close()
			} else if err := os.Mkdir(host, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		}
		cur = next
	}
	return filepath.Join(root, cur), nil
}

// lastElement says whether rest holds no more path elements.
func lastElement(rest []string) bool {
	for _, c := range rest {
		if c != "" && c != "." {
			return false
		}
	}
	return true
}

// devices are bound from the guest's /dev into a container whose /dev is a
// tmpfs (the OCI default devices), and devLinks are made beside them.
var (
	devices  = []string{"null", "zero", "full", "random", "urandom", "tty"}
	devLinks = [][2]string{
		{"ptmx", "pts/ptmx"}, {"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"},
		{"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
	}
)

func populateDev(root string) error {
	for _, d := range devices {
		dest, err := resolveIn(root, "/dev/"+d, true)
		if err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
		if err := unix.Mount("/dev/"+d, dest, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], filepath.Join(root, "dev", l[0])); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("/dev/%s: %w", l[0], err)
		}
	}
	return nil
}

// setupProcess applies the process's rlimits, no_new_privs, capabilities
// and credentials, changes to its directory and finds its program there;
// it returns the program and its environment.
func setupProcess(st *agentapi.ExecStart) (string, []string, error) {
	for _, r := range st.Rlimits {
		if err := unix.Setrlimit(int(r.Resource), &unix.Rlimit{Cur: r.Soft, Max: r.Hard}); err != nil {
			return "", nil, fmt.Errorf("rlimit %d: %w", r.Resource, err)
		}
	}
	caps := st.Capabilities
	if caps != nil {
		if err := dropBounding(caps.Bounding); err != nil {
			return "", nil, err
		}
		if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
			return "", nil, fmt.Errorf("keepcaps: %w", err)
		}
	}
	if st.Gid != nil {
		if err := syscall.Setgroups(intsOf(st.AdditionalGids)); err != nil {
			return "", nil, fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setgid(int(*st.Gid)); err != nil {
			return "", nil, fmt.Errorf("setgid: %w", err)
		}
	}
	if st.Uid != nil {
		if err := syscall.Setuid(int(*st.Uid)); err != nil {
			return "", nil, fmt.Errorf("setuid: %w", err)
		}
	}
	if caps != nil {
		if err := setCaps(caps); err != nil {
			return "", nil, err
		}
	}
	if st.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return "", nil, fmt.Errorf("no_new_privs: %w", err)
		}
	}
	dir := st.Dir
	if dir == "" {
		dir = "/"
	}
	if err := unix.Chdir(dir); err != nil {
		return "", nil, fmt.Errorf("working directory %s: %w", dir, err)
	}
	env, path := processEnv(st.Env)
	argv0, err := findProgram(st.Argv[0], path, dir)
	if err != nil {
		return "", nil, fmt.Errorf("exec %q: %w", st.Argv[0], err)
	}
	return argv0, env, nil
}

func intsOf(v []uint32) []int {
	r := make([]int, len(v))
	for i, x := range v {
		r[i] = int(x)
	}
	return r
}

// lastCap is the highest capability the kernel knows.
func lastCap() (uint32, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("capabilities: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("capabilities: cap_last_cap: %w", err)
	}
	return uint32(n), nil
}

// dropBounding removes from the bounding set every capability not in keep.
func dropBounding(keep []uint32) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	in := make(map[uint32]bool, len(keep))
	for _, c := range keep {
		in[c] = true
	}
	for c := uint32(0); c <= last; c++ {
		if !in[c] {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	return nil
}

// setCaps sets the effective, permitted and inheritable sets (capset(2),
// version 3: two 32-bit words per set) and raises the ambient ones.
func setCaps(c *agentapi.Capabilities) error {
	var data [2]unix.CapUserData
	set := func(caps []uint32, field func(*unix.CapUserData) *uint32) {
		for _, n := range caps {
			if n < 64 {
				*field(&data[n/32]) |= 1 << (n % 32)
			}
		}
	}
	set(c.Effective, func(d *unix.CapUserData) *uint32 { return &d.Effective })
	set(c.Permitted, func(d *unix.CapUserData) *uint32 { return &d.Permitted })
	set(c.Inheritable, func(d *unix.CapUserData) *uint32 { return &d.Inheritable })
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	for _, n := range c.Ambient {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(n), 0, 0); err != nil {
			return fmt.Errorf("ambient capability %d: %w", n, err)
		}
	}
	return nil
}
