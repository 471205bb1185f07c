package namedvm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vms"
	"github.com/microvm/microvm/named"
)

// Live returns the running VM named name, or an error saying it is not
// (and, for one that exited, how it ended).
func Live(name string) (vms.Entry, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return vms.Entry{}, err
	}
	e, err := store.Get(name)
	if err != nil {
		return e, err
	}
	if !e.Alive {
		return e, notRunning(name, e.State, e.ExitReason)
	}
	return e, nil
}

// notRunning says that a VM is not running, and for one that exited, how
// it ended.
func notRunning(name, state, reason string) error {
	if reason != "" {
		reason = ": " + reason
	}
	return fmt.Errorf("VM %s is not running (%s%s)", name, state, reason)
}

// Lookup returns the running VM named name as a named.VM, whose methods
// reach its control API, or Live's error. Its
// state is the VM's own view when the API answers within a moment.
func Lookup(name string) (named.VM, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := named.Lookup(ctx, name)
	if err != nil {
		return v, err
	}
	if !v.Alive {
		return v, notRunning(name, v.State, v.ExitReason)
	}
	return v, nil
}

// apiTimeout bounds a state change through a VM's control API.
const apiTimeout = 30 * time.Second

// Stop stops a running VM through its API (force: at once; otherwise the
// agent powers the guest off, and the VM is stopped after timeout), waits
// for its process to end, and kills the process if the API does not
// answer.
func Stop(name string, force bool, timeout time.Duration) error {
	v, err := Lookup(name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	apiErr := v.Stop(ctx, force, timeout)
	cancel()
	store, _ := vms.Open(vms.StateDir())
	wait := func(d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if g, err := store.Get(name); err != nil || !g.Alive {
				return true
			}
		}
		return false
	}
	if apiErr == nil && wait(timeout+10*time.Second) {
		return nil
	}
	// The API did not answer, or the VM did not end: its process goes.
	if killProcess(store, name, v.PID) == nil && wait(10*time.Second) {
		return nil
	}
	if apiErr != nil {
		return fmt.Errorf("VM %s: %w (and killing its process %d did not end it)", name, apiErr, v.PID)
	}
	return fmt.Errorf("VM %s: still running after it was killed (pid %d)", name, v.PID)
}

// beforeKill, when set (by tests), runs in killProcess between the check
// that pid is still the VM's and the signal.
var beforeKill func()

// killProcess sends SIGKILL to the process of the VM named name, pid,
// through a pidfd opened before checking that the VM is alive with that
// pid: the check then holds for the process the pidfd names, and a pid
// that the VM's process left and another process took meanwhile is never
// signalled (the pidfd's process is gone: ESRCH).
func killProcess(store *vms.Store, name string, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("VM %s: process %d: %w", name, pid, err)
	}
	defer unix.Close(fd)
	if g, err := store.Get(name); err != nil || !g.Alive || g.PID != pid {
		return fmt.Errorf("VM %s: process %d is no longer the VM's", name, pid)
	}
	if beforeKill != nil {
		beforeKill()
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("VM %s: kill process %d: %w", name, pid, err)
	}
	return nil
}

// List returns the named VMs in the state directory, by name. A running
// VM's state is its own view (paused, stopping), fresher than its record,
// where its control API answers within a moment.
func List() ([]vms.Entry, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return nil, err
	}
	list, err := store.List()
	if err != nil {
		return nil, err
	}
	for i, e := range list {
		if !e.Alive {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if v, err := named.Lookup(ctx, e.Name); err == nil && v.Alive {
			list[i].State = v.State
		}
		cancel()
	}
	return list, nil
}

// Remove removes the VMs named names from the state directory for good
// (`microvm rm`): with force a running one is stopped first (Stop, at
// once), else refused (vms.ErrRunning). Every name is tried; the errors
// are joined.
func Remove(names []string, force bool) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := remove(store, name, force); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// remove removes the VM name from store, as Remove.
func remove(store *vms.Store, name string, force bool) error {
	if force {
		if e, err := store.Get(name); err == nil && e.Alive {
			if err := Stop(name, true, 0); err != nil {
				return err
			}
		}
	}
	return store.Remove(name)
}

// liveAgent is Live for a VM whose agent a command reaches: an error too
// when it runs none.
func liveAgent(name string) (vms.Entry, error) {
	e, err := Live(name)
	if err != nil {
		return e, err
	}
	if !e.Agent {
		return e, fmt.Errorf("VM %s runs no agent (start it with --with-agent)", name)
	}
	return e, nil
}

// Agent is where the agent of the running VM named name answers
// (AgentAddr, timeout bounding the wait for it), or an error when the VM
// is not running or runs no agent: microvm cp's NAME:/PATH.
func Agent(name string, timeout time.Duration) (agentvm.Addr, error) {
	e, err := liveAgent(name)
	if err != nil {
		return agentvm.Addr{}, err
	}
	return AgentAddr(e, timeout), nil
}

// AgentAddr is where a named VM's agent answers: its vsock socket in the
// VM's directory, the agent's port; timeout bounds the wait for it.
func AgentAddr(e vms.Entry, timeout time.Duration) agentvm.Addr {
	return agentvm.Addr{UDS: e.Dir + "/" + vms.VsockSocket, Port: e.AgentPort, Timeout: timeout}
}
