package namedvm

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/microvm/microvm/internal/vms"
)

// TestKillProcessPIDReuse: when the VM's process ends between the check
// that pid is the VM's and the kill, and another process takes its pid,
// that process must not be killed. The new process is given the pid
// through /proc/sys/kernel/ns_last_pid (root only; other processes forking
// meanwhile can take the pid first, so it is tried a number of times).
func TestKillProcessPIDReuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to choose the next pid (ns_last_pid)")
	}
	store, vm, l := startVMProcess(t)
	defer l.Release()
	pid := vm.Process.Pid
	var other *exec.Cmd
	beforeKill = func() {
		vm.Process.Kill()
		vm.Wait()
		for try := 0; try < 200 && other == nil; try++ {
			if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
				t.Skipf("cannot choose the next pid: %v", err)
			}
			c := exec.Command("sleep", "1000")
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			if c.Process.Pid == pid {
				other = c
			} else {
				c.Process.Kill()
				c.Wait()
			}
		}
		if other == nil {
			t.Skip("another process kept taking the pid")
		}
	}
	defer func() { beforeKill = nil }()
	err := killProcess(store, "vm", pid)
	if other == nil {
		t.Fatalf("the hook did not run: %v", err)
	}
	// Ended here with SIGTERM, it dies of that signal unless a SIGKILL
	// was already on its way: the wait status tells, without waiting for
	// a kill that may or may not come.
	other.Process.Signal(syscall.SIGTERM)
	werr := other.Wait()
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			t.Fatalf("the process that took the VM's pid %d was killed", pid)
		}
	}
	if err == nil {
		t.Error("killProcess reported success, though the VM's process was gone")
	}
}

// TestKillProcess: a live VM's process is killed; a record whose pid is
// no longer the VM's (the name's lock is free) is refused.
func TestKillProcess(t *testing.T) {
	store, vm, l := startVMProcess(t)
	l.Release()
	if err := killProcess(store, "vm", vm.Process.Pid); err == nil {
		t.Fatal("killed the process of a VM that no longer holds its name")
	}
	l, err := store.Create(vms.Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Update(func(r *vms.Record) { r.PID = vm.Process.Pid }); err != nil {
		t.Fatal(err)
	}
	if err := killProcess(store, "vm", vm.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := vm.Wait(); err == nil {
		t.Error("the VM's process was not killed")
	}
}

// startVMProcess makes a store with a VM named vm whose record names a
// process of its own (a sleep, killed at the end of the test), the name
// held by this process's lease.
func startVMProcess(t *testing.T) (*vms.Store, *exec.Cmd, *vms.Lease) {
	t.Helper()
	store, err := vms.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	vm := exec.Command("sleep", "1000")
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Process.Kill(); vm.Wait() })
	l, err := store.Create(vms.Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(func(r *vms.Record) { r.PID = vm.Process.Pid }); err != nil {
		l.Release()
		t.Fatal(err)
	}
	return store, vm, l
}
