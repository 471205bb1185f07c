// Command init is PID 1 of the nested-KVM box (scripts/kvmbox,
// docs/testing.md): it runs inside the L1 Linux kernel that QEMU TCG boots
// with emulated AMD SVM, turns the host's root file system (9p tag
// "hostroot", read-only) into a writable overlay root, mounts the repository
// (9p tag "repo") read-write at its host path, checks that /dev/kvm works,
// runs the job's command in it and reports the result on virtio-serial ports
// named "stdout", "stderr" and "status", with a byte on "heartbeat" every few
// seconds meanwhile, and, when the command stays silent for the job's
// QuietReport, a report on the console of what every task waits on
// (silence.go). Then it kills what the command left
// behind and restarts the machine, which QEMU (-no-reboot) turns into its exit.
//
// The job (argv, environment, working directory, repository path) is
// /kvmbox/job.json in the initramfs; package kvmbox writes it (kvmbox.Job).
//
// The status port carries exactly one line: "exit N", "signal N", or
// "box-error MESSAGE" when the box itself failed before the command ran.
// Kernel and init diagnostics go to the serial console (a log file on the
// host), never to the command's streams.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/pid1"
	"github.com/microvm/microvm/internal/testing/kvmbox"
	"github.com/microvm/microvm/kvm"
)

// Job is what the host wrote.
type Job = kvmbox.Job

const (
	jobPath = "/kvmbox/job.json"
	newRoot = "/mnt/root"
)

func main() {
	logf("kvmbox init starting")
	mountEarly()
	heartbeat()
	status, err := openPort("status")
	if err != nil {
		// Without a status port nobody can be told anything: the host
		// reports "no status" and points at the console log.
		logf("%v", err)
		endVM()
	}
	line := run()
	logf("result: %s", line)
	if _, err := io.WriteString(status, line+"\n"); err != nil {
		logf("write status: %v", err)
	}
	status.Close()
	endVM()
}

// heartbeat writes a byte to the heartbeat port every
// kvmbox.HeartbeatInterval for as long as the box runs: the host ends a box
// whose L1 kernel stopped sending them (kvmbox.Options.StallTimeout).
func heartbeat() {
	port, err := openPort(kvmbox.HeartbeatPort)
	if err != nil {
		logf("%v (the host will count the box as stalled)", err)
		return
	}
	go func() {
		for {
			if _, err := port.Write([]byte{'.'}); err != nil {
				logf("heartbeat: %v", err)
				return
			}
			time.Sleep(kvmbox.HeartbeatInterval)
		}
	}()
}

// run does the work and returns the status line.
func run() string {
	job, err := readJob()
	if err != nil {
		return "box-error " + err.Error()
	}
	if err := buildRoot(job.Repo); err != nil {
		return "box-error " + err.Error()
	}
	if err := checkKVM(); err != nil {
		return "box-error no working /dev/kvm inside the box: " + err.Error()
	}
	stdout, err := openPort("stdout")
	if err != nil {
		return "box-error " + err.Error()
	}
	stderr, err := openPort("stderr")
	if err != nil {
		return "box-error " + err.Error()
	}
	if err := enterRoot(job.Dir); err != nil {
		return "box-error " + err.Error()
	}
	// Tests serve on 127.0.0.1 (the user-mode network's, for one).
	if err := pid1.LinkUp("lo"); err != nil {
		logf("%v", err)
	}
	return execute(job, stdout, stderr)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvmbox-init: "+format+"\n", args...)
}

func readJob() (*Job, error) {
	b, err := os.ReadFile(jobPath)
	if err != nil {
		return nil, fmt.Errorf("read job: %w", err)
	}
	var j Job
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("parse job: %w", err)
	}
	if len(j.Argv) == 0 || !filepath.IsAbs(j.Repo) {
		return nil, fmt.Errorf("job: empty argv or relative repository path %q", j.Repo)
	}
	return &j, nil
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

func (m mount) do() error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", m.source, m.fstype, m.target, err)
	}
	return nil
}

// mountEarly mounts what init itself needs: /proc, /sys and /dev (the
// console, the virtio-serial ports and their names in sysfs).
func mountEarly() {
	for _, m := range []mount{
		{"proc", "/proc", "proc", 0, ""},
		{"sysfs", "/sys", "sysfs", 0, ""},
		{"devtmpfs", "/dev", "devtmpfs", 0, "mode=0755"},
	} {
		if err := m.do(); err != nil && !errors.Is(err, unix.EBUSY) {
			logf("%v", err)
		}
	}
}

// 9p mount options: the read-only host root may be cached freely (nothing
// changes it while the box runs); the repository is written by the box and
// read by the host afterwards, so it keeps mmap semantics and no data cache.
const (
	opts9p     = "trans=virtio,version=9p2000.L,msize=512000"
	rootOpts9p = opts9p + ",cache=loose"
	repoOpts9p = opts9p + ",cache=mmap"
)

// cachedArtefacts are the repository's paths that the box's tests execute
// or read again and again: the CLIs, crictl, the test binaries, the
// kernels and initramfs. They are built on the host before the box starts
// and nothing in the box writes them, so they are bound from the host
// root's read-only, cached 9p view over the repository's uncached one,
// where every exec reads each page through 9p again (crictl --version:
// 0.7 s each time from the repository's mount, 0.2 s cached).
var cachedArtefacts = []string{"bin", "build/tools", "build/boxtest", "build/examples", "build/nettest", "build/kernel", "build/linux"}

// bind is a bind mount of source on target.
type bind struct{ source, target string }

// artefactBinds are the bind mounts of cachedArtefacts for the repository
// at repo (an absolute host path, the same inside the box).
func artefactBinds(repo string) []bind {
	var out []bind
	for _, p := range cachedArtefacts {
		out = append(out, bind{filepath.Join("/mnt/lower", repo, p), filepath.Join(newRoot, repo, p)})
	}
	return out
}

// buildRoot assembles newRoot: an overlay of a tmpfs on the host's root, the
// repository on top at its own path (its built artefacts bound read-only
// from the host's root: cachedArtefacts), and fresh /proc, /sys, /dev, /tmp.
func buildRoot(repo string) error {
	steps := []mount{
		{"hostroot", "/mnt/lower", "9p", unix.MS_RDONLY, rootOpts9p},
		{"upper", "/mnt/upper", "tmpfs", 0, "mode=0755"},
	}
	for _, m := range steps {
		if err := m.do(); err != nil {
			return err
		}
	}
	for _, d := range []string{"/mnt/upper/data", "/mnt/upper/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The repository goes last: it may live under /tmp or /run (a CI
	// checkout in /tmp, say), and a tmpfs mounted after it would hide it.
	steps = []mount{
		{"overlay", newRoot, "overlay", 0, "lowerdir=/mnt/lower,upperdir=/mnt/upper/data,workdir=/mnt/upper/work"},
		{"proc", newRoot + "/proc", "proc", 0, ""},
		{"sysfs", newRoot + "/sys", "sysfs", 0, ""},
		{"cgroup2", newRoot + "/sys/fs/cgroup", "cgroup2", 0, ""},
		{"devtmpfs", newRoot + "/dev", "devtmpfs", 0, "mode=0755"},
		{"devpts", newRoot + "/dev/pts", "devpts", 0, "newinstance,ptmxmode=0666,mode=0620"},
		{"shm", newRoot + "/dev/shm", "tmpfs", 0, "mode=1777"},
		{"tmp", newRoot + "/tmp", "tmpfs", 0, "mode=1777"},
		{"run", newRoot + "/run", "tmpfs", 0, "mode=0755"},
		{"repo", filepath.Join(newRoot, repo), "9p", 0, repoOpts9p},
	}
	for _, m := range steps {
		if err := m.do(); err != nil {
			return err
		}
	}
	for _, b := range artefactBinds(repo) {
		// Both must exist (a file or a directory each): a missing one
		// is not built, and a test that needs it says so.
		if _, err := os.Stat(b.source); err != nil {
			continue
		}
		if _, err := os.Stat(b.target); err != nil {
			continue
		}
		if err := unix.Mount(b.source, b.target, "", unix.MS_BIND, ""); err != nil {
			logf("bind %s on %s: %v (the repository's uncached view stays)", b.source, b.target, err)
		}
	}
	// devtmpfs has none of the links programs expect (`echo >/dev/stderr`
	// would otherwise create a plain file).
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		p := filepath.Join(newRoot, "dev", name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	return nil
}

// checkKVM opens /dev/kvm as microvm does (kvm.Open: the API version and
// the capabilities microvm needs).
func checkKVM() error {
	sys, err := kvm.Open()
	if err != nil {
		return fmt.Errorf("%w (is kvm_amd's SVM offered? see the console log)", err)
	}
	return sys.Close()
}

// openPort opens the virtio-serial port the host named name.
func openPort(name string) (*os.File, error) {
	var lastErr error
	// The ports appear shortly after the driver probes; wait a little.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ports, err := filepath.Glob("/sys/class/virtio-ports/*/name")
		if err != nil {
			return nil, err
		}
		for _, p := range ports {
			b, err := os.ReadFile(p)
			if err != nil || strings.TrimSpace(string(b)) != name {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(p))
			f, err := os.OpenFile(dev, os.O_WRONLY, 0)
			if err != nil {
				lastErr = err
				continue
			}
			return f, nil
		}
	}
	if lastErr == nil {
		lastErr = errors.New("not found in /sys/class/virtio-ports")
	}
	return nil, fmt.Errorf("virtio-serial port %q: %w", name, lastErr)
}

// enterRoot makes the box's root the root of its mount namespace, as
// switch_root does (the root mounted over the initramfs, then chroot), not
// with a bare chroot: a process that joins the namespace with setns (runc
// exec, nsenter) lands on the namespace's root, which must be this one.
func enterRoot(dir string) error {
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot %s: %w", newRoot, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if dir == "" {
		return nil
	}
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("working directory %s is not in the box (the host's / is there read-only, "+
			"the repository read-write; /tmp and /run are the box's own): %w", dir, err)
	}
	return nil
}

// execute runs the command in its own session, copies its output to the
// ports, reaps every orphan that is reparented to init meanwhile, and once
// the command is done kills whatever it left running.
func execute(job *Job, stdout, stderr *os.File) string {
	path := job.Argv[0]
	if !strings.Contains(path, "/") {
		// Look the command up in the job's PATH, not init's.
		for _, e := range job.Env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				os.Setenv("PATH", v)
			}
		}
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(stderr, "kvmbox: %v\n", err)
			return "exit 127"
		}
		path = p
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return "box-error " + err.Error()
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return "box-error " + err.Error()
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return "box-error " + err.Error()
	}
	proc, err := os.StartProcess(path, job.Argv, &os.ProcAttr{
		Env:   job.Env,
		Files: []*os.File{devnull, outW, errW},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	outW.Close()
	errW.Close()
	devnull.Close()
	if err != nil {
		// As a shell says it: 127 for a command that is not there, 126
		// for one that cannot be run.
		fmt.Fprintf(stderr, "kvmbox: %v\n", err)
		if errors.Is(err, os.ErrNotExist) {
			return "exit 127"
		}
		return "exit 126"
	}
	var copies sync.WaitGroup
	out := kvmbox.NewOutputClock()
	copies.Add(2)
	go func() { defer copies.Done(); _, _ = io.Copy(out.Writer(stdout), outR) }()
	go func() { defer copies.Done(); _, _ = io.Copy(out.Writer(stderr), errR) }()
	if job.QuietReport > 0 {
		done := make(chan struct{})
		defer close(done)
		go watchSilence(out, job.QuietReport, done, func() { reportTasks(os.Stderr, job.QuietReport) })
	}

	var ws unix.WaitStatus
	for {
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return "box-error wait: " + err.Error()
		}
		if pid == proc.Pid {
			break
		}
	}
	// Whatever the command left behind (daemons, a microvm it started)
	// goes now, or it would hold the pipes open and the box would never end.
	_ = unix.Kill(-1, unix.SIGKILL)
	for {
		if _, err := unix.Wait4(-1, nil, 0, nil); errors.Is(err, unix.ECHILD) {
			break
		}
	}
	copies.Wait()
	stdout.Close()
	stderr.Close()
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("signal %d", int(ws.Signal()))
	}
	return fmt.Sprintf("box-error unexpected wait status %#x", uint32(ws))
}

// endVM syncs and restarts the machine; with reboot=t and QEMU's -no-reboot
// that ends QEMU. PID 1 must never return.
func endVM() {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	logf("reboot: %v", err)
	for {
		time.Sleep(time.Hour)
	}
}
