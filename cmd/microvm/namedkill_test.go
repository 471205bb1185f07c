package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/vms"
)

// TestKillVMProcessPIDReuse: when the VM's process ends between the check
// that pid is the VM's and the kill, and another process takes its pid,
// that process must not be killed. The new process is given the pid
// through /proc/sys/kernel/ns_last_pid (root only; other processes forking
// meanwhile can take the pid first, so it is tried a number of times).
func TestKillVMProcessPIDReuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to choose the next pid (ns_last_pid)")
	}
	store, err := vms.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	vm := exec.Command("sleep", "1000")
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	defer vm.Process.Kill()
	// This process holds the name; the record says the VM is vm.
	l, err := store.Create(vms.Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Update(func(r *vms.Record) { r.PID = vm.Process.Pid }); err != nil {
		t.Fatal(err)
	}
	pid := vm.Process.Pid
	var other *exec.Cmd
	beforeVMKill = func() {
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
	defer func() { beforeVMKill = nil }()
	err = killVMProcess(store, "vm", pid)
	if other == nil {
		t.Fatalf("the hook did not run: %v", err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	time.Sleep(50 * time.Millisecond)
	// Not reaped yet, a killed process still takes signal 0: its state
	// tells (Z).
	stat, err2 := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err2 != nil || strings.Contains(string(stat), ") Z ") {
		t.Fatalf("the process that took the VM's pid %d was killed", pid)
	}
	if err == nil {
		t.Error("killVMProcess reported success, though the VM's process was gone")
	}
}

// TestKillVMProcess: a live VM's process is killed; a record whose pid is
// no longer the VM's (the name's lock is free) is refused.
func TestKillVMProcess(t *testing.T) {
	store, err := vms.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	vm := exec.Command("sleep", "1000")
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	defer vm.Process.Kill()
	l, err := store.Create(vms.Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(func(r *vms.Record) { r.PID = vm.Process.Pid }); err != nil {
		t.Fatal(err)
	}
	l.Release()
	if err := killVMProcess(store, "vm", vm.Process.Pid); err == nil {
		t.Fatal("killed the process of a VM that no longer holds its name")
	}
	l, err = store.Create(vms.Record{Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Update(func(r *vms.Record) { r.PID = vm.Process.Pid }); err != nil {
		t.Fatal(err)
	}
	if err := killVMProcess(store, "vm", vm.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := vm.Wait(); err == nil {
		t.Error("the VM's process was not killed")
	}
}
