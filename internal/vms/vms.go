// Package vms keeps the named VMs of a host: one directory each under the
// state directory, holding the VM's record (vm.json), its control socket,
// its vsock socket and its console log, and beside it the VM's lock.
//
//	$MICROVM_STATE_DIR/vms/.NAME.lock
//	                  flock'd by the VM's process for as long as it lives;
//	                  outside the directory, so that removing the directory
//	                  never unlinks a lock someone holds (a name starts
//	                  with a letter or digit: no VM directory is named so)
//	$MICROVM_STATE_DIR/vms/NAME/
//	    vm.json       the Record: JSON padded with spaces to RecordSize (or more, up to MaxRecordSize),
//	                  rewritten in place (the VM's process may be confined
//	                  by seccomp by then: no open, no rename)
//	    api.sock      the control API (internal/vmctl)
//	    vsock.sock    the vsock device's Unix socket (and vsock.sock_PORT)
//	    console.log   the console, two files of at most ConsoleMax bytes
//	    console.log.1 each, written in turn (ConsoleLog)
//	    microvm.log   a detached VM's own diagnostics (its stderr)
//
// Liveness is the lock, not the pid: a process that crashed (SIGKILL, a
// panic) leaves its directory, but not its lock, so the entry reads as
// exited and its name can be taken again; a pid can be reused, a lock
// cannot outlive its holder.
//
// Owner: a Lease belongs to the process that created the VM; List, Get
// and Remove only read locks (or take them briefly, to remove).
package vms

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Files in a VM's directory.
const (
	RecordFile  = "vm.json"
	APISocket   = "api.sock"
	VsockSocket = "vsock.sock"
	ConsoleFile = "console.log"
	LogFile     = "microvm.log"
)

// States of a VM as its record and its lock tell them.
const (
	StateStarting = "starting" // the process holds the lock, the VM is being built
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopping = "stopping"
	StateExited   = "exited" // ended; or its process died without saying so
)

// ErrNameInUse is returned by Create for a name a live VM has.
var ErrNameInUse = errors.New("a running VM has that name")

// ErrNotFound is returned for a name no VM has.
var ErrNotFound = errors.New("no such VM")

// ErrRunning is returned by Remove for a VM that is still running.
var ErrRunning = errors.New("the VM is running")

// StateDir is where microvm keeps its state: $MICROVM_STATE_DIR, else
// /var/lib/microvm for root, else $XDG_DATA_HOME/microvm
// (~/.local/share/microvm), else, for a user without a home directory,
// $TMPDIR/microvm-UID, which CheckStateDir must accept before use.
func StateDir() string {
	if d := os.Getenv("MICROVM_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/microvm"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "microvm")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return fallbackStateDir()
	}
	return filepath.Join(home, ".local", "share", "microvm")
}

// fallbackStateDir is the state directory of a user without a home: a
// name in the shared temporary directory, which another local user may
// have made first (to read or swap what microvm keeps there).
func fallbackStateDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("microvm-%d", os.Geteuid()))
}

// ErrUnsafeStateDir is returned for a state directory in the shared
// temporary directory that is not this user's private directory.
var ErrUnsafeStateDir = errors.New("not a private directory of this user")

// CheckStateDir accepts stateDir for use. The fallback in the temporary
// directory is made (0700) when missing, and must then be a directory, not
// a symlink, owned by this user and closed to everyone else (mode 0700 or
// tighter); the sticky temporary directory keeps others from swapping it
// after this check. Other state directories are the user's choice and are
// taken as they are.
func CheckStateDir(stateDir string) error {
	if stateDir != fallbackStateDir() {
		return nil
	}
	if err := os.Mkdir(stateDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(stateDir, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	why := ""
	switch uid := uint32(os.Geteuid()); {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		why = "is a symlink"
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		why = "is not a directory"
	case st.Uid != uid:
		why = fmt.Sprintf("is owned by uid %d, not %d", st.Uid, uid)
	case st.Mode&0o077 != 0:
		why = fmt.Sprintf("has mode %04o, open to others", st.Mode&0o7777)
	default:
		return nil
	}
	return fmt.Errorf("state directory %s %s: %w; refusing it (remove it, or set $MICROVM_STATE_DIR or $HOME)",
		stateDir, why, ErrUnsafeStateDir)
}

// CheckName accepts 1 to 63 letters, digits, '_', '.' and '-', starting
// with a letter or digit: a name that is a safe directory name and keeps
// the socket paths short.
func CheckName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("VM name %q: want 1 to 63 characters", name)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return fmt.Errorf("VM name %q: want letters, digits, '_', '.' and '-', starting with a letter or digit", name)
		}
	}
	return nil
}

// Record is what vm.json holds about a VM.
type Record struct {
	Name        string    `json:"name"`
	State       string    `json:"state"`
	PID         int       `json:"pid"`
	Created     time.Time `json:"created"`
	Ended       time.Time `json:"ended,omitzero"`
	ExitStatus  int       `json:"exit_status"` // once exited: what `microvm run` exited with
	ExitReason  string    `json:"exit_reason,omitempty"`
	CPUs        int       `json:"cpus"`
	MemoryBytes uint64    `json:"memory_bytes"`
	Kernel      string    `json:"kernel"`
	Initrd      string    `json:"initrd,omitempty"`
	Disks       []string  `json:"disks,omitempty"`
	// Agent says the guest runs microvm's agent on AgentPort: exec --vm,
	// cp and a graceful stop use it.
	Agent     bool   `json:"agent"`
	AgentPort uint32 `json:"agent_port,omitempty"`
	VsockCID  uint64 `json:"vsock_cid"`
	// Image is the OCI image the VM runs as its root (run --image), as the
	// user named it; Process holds its configuration's defaults, which
	// exec --vm applies as docker exec applies a container's.
	Image   string   `json:"image,omitempty"`
	Process *Process `json:"process,omitempty"`
	// Restored is the snapshot the VM was restored from (restore
	// --name), or "" for a VM that booted.
	Restored string `json:"restored_from,omitempty"`
}

// Process is what an image says a command runs with: exec --vm's defaults.
type Process struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// UID and GID, when HasUser, are the image's User, resolved.
	HasUser bool   `json:"has_user,omitempty"`
	UID     uint32 `json:"uid,omitempty"`
	GID     uint32 `json:"gid,omitempty"`
}

// Store is the VMs under one state directory.
type Store struct {
	dir string // STATE/vms
}

// Open returns the store under stateDir, creating it (0700) if needed;
// stateDir must pass CheckStateDir.
func Open(stateDir string) (*Store, error) {
	if err := CheckStateDir(stateDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "vms")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the directory of the VM named name.
func (s *Store) Dir(name string) string { return filepath.Join(s.dir, name) }

// LockPath is the lock of the VM named name, beside its directory.
func (s *Store) LockPath(name string) string { return filepath.Join(s.dir, "."+name+".lock") }

// legacyLockFile is where a VM's lock was before it moved beside the
// directory: a VM started by an older microvm still holds it.
const legacyLockFile = "lock"

// errLocked is takeLock's answer for a lock another process holds.
var errLocked = errors.New("locked")

// lockHook, when set (by tests), runs in takeLock between opening the lock
// file and locking it: where a concurrent Remove can unlink it.
var lockHook func(path string)

// removeAll removes a VM's directory (a variable, for tests to interleave
// a Create with the removal).
var removeAll = os.RemoveAll

// takeLock opens and flocks the lock file at path (errLocked when another
// process holds it). A lock file is unlinked by Remove while Remove holds
// it; a process that opened it before and locks it after would hold a
// lock nobody else can see, so the lock taken must still be the file at
// path, else it is dropped and taken again.
func takeLock(path string) (*os.File, error) {
	for try := 0; ; try++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		if lockHook != nil {
			lockHook(path)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, errLocked
			}
			return nil, err
		}
		var held, named unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, err
		}
		err = unix.Lstat(path, &named)
		if err == nil && held.Dev == named.Dev && held.Ino == named.Ino {
			return f, nil
		}
		f.Close()
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
		if try == 100 {
			return nil, fmt.Errorf("%s: removed each time it was locked", path)
		}
	}
}

// RecordSize is vm.json's least size: the record's JSON, padded with
// spaces. A larger record (an image's whole Env: CUDA images hold several
// KiB) makes the file larger, up to MaxRecordSize; it never shrinks, so a
// rewrite in place always covers the longer record before it.
const RecordSize = 4096

// MaxRecordSize bounds vm.json, which Get reads whole.
const MaxRecordSize = 1 << 20

// Lease is a created VM's hold on its name: its lock, held until Release,
// and its record file, open for rewriting in place.
type Lease struct {
	dir     string
	lock    *os.File
	recFile *os.File
	rec     Record
	size    int // vm.json's length as last written
}

// Create claims rec.Name: it makes the VM's directory, takes its lock and
// writes the record (state starting, this process's pid). A directory left
// by a VM that is no longer running is cleared first; a live one is
// ErrNameInUse. The socket paths must fit a Unix socket address.
func (s *Store) Create(rec Record) (*Lease, error) {
	if err := CheckName(rec.Name); err != nil {
		return nil, err
	}
	dir := s.Dir(rec.Name)
	if p := filepath.Join(dir, VsockSocket) + "_4294967295.dgram"; len(p) > 107 {
		return nil, fmt.Errorf("state directory %s: a VM's socket paths there would be %d bytes, over the 107 a Unix socket address holds (set $MICROVM_STATE_DIR to a shorter path)", s.dir, len(p))
	}
	lock, err := takeLock(s.LockPath(rec.Name))
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("VM %s: %w (microvm rm -f %s, or another name)", rec.Name, ErrNameInUse, rec.Name)
	} else if err != nil {
		return nil, fmt.Errorf("VM %s: lock: %w", rec.Name, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		lock.Close()
		return nil, fmt.Errorf("VM %s: %w", rec.Name, err)
	}
	if locked(filepath.Join(dir, legacyLockFile)) {
		lock.Close()
		return nil, fmt.Errorf("VM %s: %w (microvm rm -f %s, or another name)", rec.Name, ErrNameInUse, rec.Name)
	}
	// The name was free: whatever an earlier VM of that name left goes.
	if err := clearDir(dir); err != nil {
		lock.Close()
		return nil, fmt.Errorf("VM %s: %w", rec.Name, err)
	}
	rec.State, rec.PID = StateStarting, os.Getpid()
	if rec.Created.IsZero() {
		rec.Created = time.Now().UTC()
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("VM %s: %w", rec.Name, err)
	}
	l := &Lease{dir: dir, lock: lock, recFile: f, rec: rec}
	if err := l.write(); err != nil {
		f.Close()
		lock.Close()
		return nil, err
	}
	return l, nil
}

// clearDir removes everything in dir.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Dir is the VM's directory.
func (l *Lease) Dir() string { return l.dir }

// Path is the file name in the VM's directory.
func (l *Lease) Path(name string) string { return filepath.Join(l.dir, name) }

// Record is the lease's record as last written.
func (l *Lease) Record() Record { return l.rec }

// Update changes the record with f and writes it.
func (l *Lease) Update(f func(*Record)) error {
	f(&l.rec)
	return l.write()
}

// write rewrites vm.json in place: the JSON, padded with spaces to
// RecordSize or the length last written, whichever is more, in one pwrite (a reader that meets a write half done retries:
// Get).
func (l *Lease) write() error {
	b, err := json.MarshalIndent(l.rec, "", "  ")
	if err != nil {
		return err
	}
	if len(b) >= MaxRecordSize {
		return fmt.Errorf("VM %s: record of %d bytes, over %d (an image Env that large?)", l.rec.Name, len(b), MaxRecordSize)
	}
	size := max(RecordSize, l.size, len(b)+1)
	buf := append(b, bytes.Repeat([]byte{' '}, size-1-len(b))...)
	buf = append(buf, '\n')
	if _, err := l.recFile.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("VM %s: %w", l.rec.Name, err)
	}
	l.size = size
	return nil
}

// Release gives the name up: the record stays (state exited, for ls and
// logs) until Remove.
func (l *Lease) Release() error {
	if l.lock == nil {
		return nil
	}
	err := errors.Join(l.recFile.Close(), l.lock.Close()) // the lock's close drops the flock
	l.lock = nil
	return err
}

// Entry is one VM as List and Get find it.
type Entry struct {
	Record
	Dir string
	// Alive says a process holds the VM's lock. A record that says it
	// runs while nothing holds the lock is a VM whose process died: its
	// State is reported as exited.
	Alive bool
}

// Get returns the VM named name.
func (s *Store) Get(name string) (Entry, error) {
	if err := CheckName(name); err != nil {
		return Entry{}, err
	}
	dir := s.Dir(name)
	e := Entry{Dir: dir}
	for try := 0; ; try++ {
		b, err := readRecord(filepath.Join(dir, RecordFile))
		if errors.Is(err, fs.ErrNotExist) {
			return Entry{}, fmt.Errorf("VM %s: %w", name, ErrNotFound)
		} else if err != nil {
			return Entry{}, fmt.Errorf("VM %s: %w", name, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return Entry{}, fmt.Errorf("VM %s: %w", name, ErrNotFound) // being created
		}
		err = json.Unmarshal(b, &e.Record)
		if err == nil {
			break
		}
		if try == 3 {
			return Entry{}, fmt.Errorf("VM %s: %s: %w", name, RecordFile, err)
		}
		time.Sleep(time.Millisecond) // a rewrite half done
	}
	e.Alive = locked(s.LockPath(name)) || locked(filepath.Join(dir, legacyLockFile))
	if !e.Alive && e.State != StateExited {
		e.State, e.ExitReason = StateExited, "the microvm process ended without saying how (killed?)"
	}
	return e, nil
}

// readRecord reads vm.json, at most MaxRecordSize bytes: a state
// directory is the user's own, but a record grown past what write ever
// makes (a file put there by hand, a full disk's garbage) must not make
// every ls read it whole.
func readRecord(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxRecordSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxRecordSize {
		return nil, fmt.Errorf("%s is over %d bytes: not a record microvm wrote", RecordFile, MaxRecordSize)
	}
	return b, nil
}

// locked says whether a process holds the lock at path.
func locked(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return false
	}
	return errors.Is(err, unix.EWOULDBLOCK)
}

// List returns every VM, by name.
func (s *Store) List() ([]Entry, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	var out []Entry
	for _, d := range entries {
		if !d.IsDir() || CheckName(d.Name()) != nil {
			continue
		}
		e, err := s.Get(d.Name())
		if errors.Is(err, ErrNotFound) {
			continue // being created, or half removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes a VM that is not running (ErrRunning otherwise). It holds
// the VM's lock while it removes the directory, so a VM starting under the
// same name meanwhile finds the name in use; the lock file goes last,
// while still held (takeLock sees that).
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	dir := s.Dir(name)
	if _, err := os.Stat(filepath.Join(dir, RecordFile)); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("VM %s: %w", name, ErrNotFound)
		}
	}
	lock, err := takeLock(s.LockPath(name))
	if errors.Is(err, errLocked) {
		return fmt.Errorf("VM %s: %w (microvm stop %s first, or rm -f)", name, ErrRunning, name)
	} else if err != nil {
		return fmt.Errorf("VM %s: lock: %w", name, err)
	}
	defer lock.Close()
	if locked(filepath.Join(dir, legacyLockFile)) {
		return fmt.Errorf("VM %s: %w (microvm stop %s first, or rm -f)", name, ErrRunning, name)
	}
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	if err := os.Remove(s.LockPath(name)); err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	return nil
}

// Describe is a record's configuration in a few words, for ls.
func (r Record) Describe() string {
	var parts []string
	if r.Image != "" {
		parts = append(parts, "image "+r.Image)
	}
	if r.Agent {
		parts = append(parts, "agent")
	}
	disks := r.Disks
	if r.Image != "" && len(disks) > 0 {
		disks = disks[1:] // the image's own
	}
	for _, d := range disks {
		parts = append(parts, "disk "+filepath.Base(d))
	}
	return strings.Join(parts, ", ")
}
