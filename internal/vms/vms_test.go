package vms

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "ci-job.42", "A_b", strings.Repeat("x", 63)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", ".a", "a/b", "..", "a b", strings.Repeat("x", 64), "ä"} {
		if err := CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) = nil, want an error", bad)
		}
	}
}

// TestLifecycle: a created VM is alive and its name taken; released, it
// reads as exited and the name is free; Remove deletes it, and refuses a
// live one.
func TestLifecycle(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Create(Record{Name: "vm1", CPUs: 2, MemoryBytes: 64 << 20, Agent: true})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Get("vm1")
	if err != nil || !e.Alive || e.State != StateStarting || e.PID != os.Getpid() || e.CPUs != 2 {
		t.Fatalf("Get: %+v, %v", e, err)
	}
	if err := l.Update(func(r *Record) { r.State = StateRunning }); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get("vm1"); e.State != StateRunning {
		t.Errorf("state %q after Update, want running", e.State)
	}
	if _, err := s.Create(Record{Name: "vm1"}); !errors.Is(err, ErrNameInUse) {
		t.Errorf("second Create: %v, want ErrNameInUse", err)
	}
	if err := s.Remove("vm1"); !errors.Is(err, ErrRunning) {
		t.Errorf("Remove of a live VM: %v, want ErrRunning", err)
	}
	if err := os.WriteFile(l.Path(ConsoleFile), []byte("old console\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	// Released without saying it exited: a crashed process.
	if e, _ := s.Get("vm1"); e.Alive || e.State != StateExited || e.ExitReason == "" {
		t.Errorf("after Release: %+v; want exited, not alive, with a reason", e)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "vm1" {
		t.Fatalf("List: %+v, %v", list, err)
	}
	// The name is free again: a new VM clears what the old one left.
	l2, err := s.Create(Record{Name: "vm1"})
	if err != nil {
		t.Fatalf("Create over an exited VM: %v", err)
	}
	if _, err := os.Stat(l2.Path(ConsoleFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old console log survived: %v", err)
	}
	l2.Release()
	if err := s.Remove("vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("vm1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v, want ErrNotFound", err)
	}
	if err := s.Remove("vm1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v, want ErrNotFound", err)
	}
}

// TestLockHeldByAnotherProcess: the lock is what tells a live VM, across
// processes: a child holding it makes the VM alive; killed, the VM is
// exited and the name free. The child is this test binary (see
// TestHelperHoldLock), not flock(1): flock(1) forks its command, and the
// forked copy holds the lock's file for a moment after the fork, so a kill
// that came quickly left the lock held and the test failed under load.
func TestLockHeldByAnotherProcess(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Create(Record{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	child := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$")
	child.Env = append(os.Environ(), holdLockEnv+"="+s.LockPath("other"))
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("the child did not take the lock: %q, %v", line, err)
	}
	if e, _ := s.Get("other"); !e.Alive {
		t.Error("not alive while another process holds the lock")
	}
	if _, err := s.Create(Record{Name: "other"}); !errors.Is(err, ErrNameInUse) {
		t.Errorf("Create while another process holds the lock: %v", err)
	}
	child.Process.Kill()
	child.Wait()
	if e, _ := s.Get("other"); e.Alive {
		t.Error("still alive after its process died")
	}
	if l, err := s.Create(Record{Name: "other"}); err != nil {
		t.Errorf("Create after the holder died: %v", err)
	} else {
		l.Release()
	}
}

const holdLockEnv = "MICROVM_VMS_TEST_HOLD_LOCK"

// TestHelperHoldLock is TestLockHeldByAnotherProcess's child: with the
// environment variable set it takes the lock on the file it names, says so
// on stdout and waits to be killed. Run plainly, it returns at once.
func TestHelperHoldLock(t *testing.T) {
	path := os.Getenv(holdLockEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("locked\n")
	time.Sleep(time.Minute)
	t.Fatal("not killed within a minute")
}

// TestSocketPathTooLong: a state directory too deep for socket paths is
// refused with a message saying how to fix it.
func TestSocketPathTooLong(t *testing.T) {
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 60))
	s, err := Open(deep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(Record{Name: strings.Repeat("n", 40)}); err == nil || !strings.Contains(err.Error(), "MICROVM_STATE_DIR") {
		t.Errorf("Create: %v, want the socket path refused", err)
	}
}

// TestConsoleLog: writes rotate at the bound; ReadConsole gives the two
// files oldest first; nothing is lost below twice the bound.
func TestConsoleLog(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenConsoleLog(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for i := 0; i < 30; i++ {
		line := []byte(strings.Repeat(string(rune('a'+i%26)), 9) + "\n")
		all.Write(line)
		if n, err := c.Write(line); n != len(line) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
		time.Sleep(2 * time.Millisecond) // the files' modification times tell their order
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadConsole(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 200 || !bytes.HasSuffix(all.Bytes(), got) || len(got) < 100 {
		t.Errorf("console holds %d bytes %q; want the last 100..200 of what was written", len(got), got)
	}
	for _, name := range []string{ConsoleFile, ConsoleFile + ".1"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() > 100 {
			t.Errorf("%s: %v, %v; want at most 100 bytes", name, fi, err)
		}
	}
}

// TestFallbackStateDirMustBePrivate: without a home, the state directory
// is $TMPDIR/microvm-UID; one that another user made first, a symlink, a
// file or a directory open to others is refused with one line, and nothing
// is made in it; a missing one is made 0700 and used.
func TestFallbackStateDirMustBePrivate(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("MICROVM_STATE_DIR", "")
	t.Setenv("XDG_DATA_HOME", "")
	t.Setenv("HOME", "")
	dir := filepath.Join(tmp, "microvm-"+strconv.Itoa(os.Geteuid()))
	if got := StateDir(); os.Geteuid() != 0 && got != dir {
		t.Fatalf("StateDir() = %s, want %s", got, dir)
	}
	elsewhere := t.TempDir()
	for _, tc := range []struct {
		name string
		make func() error
		why  string
	}{
		{"symlink", func() error { return os.Symlink(elsewhere, dir) }, "is a symlink"},
		{"file", func() error { return os.WriteFile(dir, nil, 0o600) }, "is not a directory"},
		{"open to others", func() error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		}, "has mode 0777"},
		{"another user's", func() error {
			if os.Geteuid() != 0 {
				t.Skip("needs root to make a directory another user owns")
			}
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chown(dir, 4242, 4242)
		}, "is owned by uid 4242"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.RemoveAll(dir)
			if err := tc.make(); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir)
			if !errors.Is(err, ErrUnsafeStateDir) || !strings.Contains(err.Error(), tc.why) ||
				!strings.Contains(err.Error(), "MICROVM_STATE_DIR") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Open: %v; want one line with ErrUnsafeStateDir, %q and how to allow it", err, tc.why)
			}
			if _, err := os.Lstat(filepath.Join(dir, "vms")); err == nil {
				t.Error("vms/ was made in the refused directory")
			}
			if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
				t.Error("something was made through the symlink")
			}
		})
	}
	os.RemoveAll(dir)
	if _, err := Open(dir); err != nil {
		t.Fatalf("Open of a missing fallback: %v", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("the fallback made: %v, %v; want a 0700 directory", fi.Mode(), err)
	}
}

// TestRemoveRacingCreate: a Create that runs while Remove is removing the
// directory (here: after the directory's first entries went) must not
// leave a live VM whose lock Remove then deletes, for a third Create
// would then start a second live VM of the same name.
func TestRemoveRacingCreate(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Create(Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	var during *Lease
	removeAll = func(dir string) error {
		// os.RemoveAll removes entries one by one; the lock of the old
		// layout may go first.
		os.Remove(filepath.Join(dir, legacyLockFile))
		os.Remove(filepath.Join(dir, RecordFile))
		during, _ = s.Create(Record{Name: "vm"})
		return os.RemoveAll(dir)
	}
	defer func() { removeAll = os.RemoveAll }()
	if err := s.Remove("vm"); err != nil {
		t.Fatal(err)
	}
	removeAll = os.RemoveAll
	after, err := s.Create(Record{Name: "vm"})
	if during != nil && after != nil {
		t.Fatal("two live VMs named vm: one created during Remove, one after")
	}
	live := during
	if live == nil {
		live = after
	}
	if live == nil {
		t.Fatalf("no VM named vm after Remove: %v", err)
	}
	defer live.Release()
	if _, err := s.Create(Record{Name: "vm"}); !errors.Is(err, ErrNameInUse) {
		t.Errorf("another Create: %v, want ErrNameInUse", err)
	}
}

// TestCreateRacingRemoveUnlink: a Create that opened the lock file just
// before Remove unlinked it, and locks it just after, holds a lock on a
// file that is gone; it must notice and take the lock at the path, so
// that the VM reads as alive and its name stays taken.
func TestCreateRacingRemoveUnlink(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Create(Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	var removeErr error
	removed := false
	lockHook = func(string) {
		if !removed {
			removed = true
			removeErr = s.Remove("vm")
		}
	}
	defer func() { lockHook = nil }()
	l, err = s.Create(Record{Name: "vm"})
	lockHook = nil
	if removeErr != nil {
		t.Fatalf("Remove between open and lock: %v", removeErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if e, err := s.Get("vm"); err != nil || !e.Alive {
		t.Errorf("Get: %+v, %v; want alive", e, err)
	}
	if l2, err := s.Create(Record{Name: "vm"}); !errors.Is(err, ErrNameInUse) {
		t.Errorf("another Create: %v, want ErrNameInUse", err)
		if l2 != nil {
			l2.Release()
		}
	}
}

// TestLargeRecord: an image with a large Env (CUDA devel images hold
// several KiB) fits in vm.json; a later, shorter record is read back whole
// (the file keeps its length, padded); one over MaxRecordSize is refused.
func TestLargeRecord(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for i := 0; i < 2000; i++ {
		env = append(env, "VAR_"+strconv.Itoa(i)+"="+strings.Repeat("x", 30))
	}
	l, err := s.Create(Record{Name: "big", Image: "nvidia/cuda:devel", Process: &Process{Env: env}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	e, err := s.Get("big")
	if err != nil || e.Process == nil || len(e.Process.Env) != len(env) || e.Process.Env[1999] != env[1999] {
		t.Fatalf("Get: %v; want the %d Env entries back", err, len(env))
	}
	if err := l.Update(func(r *Record) { r.Process = nil; r.State = StateRunning }); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Get("big"); err != nil || e.Process != nil || e.State != StateRunning {
		t.Fatalf("Get after a shorter record: %+v, %v", e, err)
	}
	err = l.Update(func(r *Record) { r.Process = &Process{Env: []string{strings.Repeat("y", MaxRecordSize)}} })
	if err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("a record over MaxRecordSize: %v, want refused", err)
	}
}

// TestGetRefusesOversizedRecord: a vm.json past MaxRecordSize, which
// write never makes, is refused rather than read whole.
func TestGetRefusesOversizedRecord(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir("big")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, RecordFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"name":"big"}`); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxRecordSize + 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.Get("big"); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("Get of an oversized vm.json: %v; want a refusal", err)
	}
}

// TestCheckStateDir: the fallback state directory in the shared temporary
// directory is made private when missing and refused when someone else
// could have made it (a symlink, a file, open to others, another owner);
// any other directory is the user's choice.
func TestCheckStateDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir := fallbackStateDir()
	if err := CheckStateDir(dir); err != nil {
		t.Fatalf("a missing fallback: %v", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the fallback made: %v, %v", fi, err)
	}
	if err := CheckStateDir(dir); err != nil {
		t.Fatalf("the fallback again: %v", err)
	}
	os.Remove(dir)

	elsewhere := t.TempDir()
	cases := []struct {
		why  string
		make func() error
	}{
		{"is a symlink", func() error { return os.Symlink(elsewhere, dir) }},
		{"is not a directory", func() error { return os.WriteFile(dir, nil, 0o600) }},
		{"open to others", func() error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chmod(dir, 0o755)
		}},
	}
	if os.Geteuid() == 0 {
		cases = append(cases, struct {
			why  string
			make func() error
		}{"is owned by uid 4242", func() error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chown(dir, 4242, 4242)
		}})
	}
	for _, tc := range cases {
		if err := tc.make(); err != nil {
			t.Fatal(err)
		}
		err := CheckStateDir(dir)
		if !errors.Is(err, ErrUnsafeStateDir) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("a fallback that %s: %v", tc.why, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}

	// Not the fallback: taken as it is.
	open := filepath.Join(t.TempDir(), "mine")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := CheckStateDir(open); err != nil {
		t.Errorf("a chosen directory: %v", err)
	}
}
