package agent

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// child is one process started for an Exec, from the fork until its exit
// status has been collected.
type child struct {
	pid int
	// beforeReap runs exactly once, on the goroutine that waits for the
	// child, after the child has exited but before it is reaped: the pid,
	// and so the process group id, cannot be reused while it runs.
	beforeReap func(pid int)
	done       chan struct{} // closed when status and err are set

	status unix.WaitStatus // written before done is closed
	err    error           // the exit status could not be collected
}

func newChild(pid int, beforeReap func(pid int)) *child {
	return &child{pid: pid, beforeReap: beforeReap, done: make(chan struct{})}
}

// reap runs beforeReap, collects the exit status of the exited child and
// closes done.
func (c *child) reap() {
	c.beforeReap(c.pid)
	for {
		_, err := unix.Wait4(c.pid, &c.status, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			c.err = fmt.Errorf("agent: wait for pid %d: %w", c.pid, err)
		}
		break
	}
	close(c.done)
}

// starter forks processes and waits for them. directStarter waits for each
// child on its own; a *Reaper waits for every child of the process.
type starter interface {
	start(argv0 string, argv []string, attr *syscall.ProcAttr, beforeReap func(pid int)) (*child, error)
}

// directStarter waits for each child with waitid(P_PID, pid, WNOWAIT) in a
// goroutine of its own, then wait4(pid): it never touches other children of
// the process, so it suits an agent that is not PID 1 (or a program that
// embeds the server and runs other children). The goroutine belongs to the
// child and ends when the child exits.
type directStarter struct{}

func (directStarter) start(argv0 string, argv []string, attr *syscall.ProcAttr, beforeReap func(pid int)) (*child, error) {
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return nil, err
	}
	c := newChild(pid, beforeReap)
	go func() {
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		c.reap() // on a waitid error reap reports it through wait4's
	}()
	return c, nil
}

// Reaper waits for every child of the process, as PID 1 must: orphans
// reparented to it (background processes of an Exec, daemons) are reaped
// and forgotten, and processes started by Exec have their exit status
// delivered to the Exec that started them, never stolen.
//
// How: on each SIGCHLD the reaper goroutine asks waitid(P_ALL, WNOHANG |
// WNOWAIT) for an exited child without reaping it, then, holding mu, looks
// its pid up. A known child gets its beforeReap hook and is reaped for its
// Exec; an unknown one is reaped and dropped. start holds mu from the fork
// until the pid is registered, so a child that exits at once is still
// known by the time the reaper can look it up.
//
// Goroutines: one, started by NewReaper and stopped by Close. Lock order:
// Reaper.mu, then the locks taken by beforeReap hooks (an Exec's group.mu).
type Reaper struct {
	mu       sync.Mutex
	children map[int]*child // guarded by mu; pid -> child started by start

	sigc chan os.Signal
	stop chan struct{}
	done chan struct{}
}

// NewReaper starts reaping. It should be created before any child is
// started, and there must be only one per process.
func NewReaper() *Reaper {
	r := &Reaper{
		children: make(map[int]*child),
		sigc:     make(chan os.Signal, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	signal.Notify(r.sigc, unix.SIGCHLD)
	go r.loop()
	return r
}

// Close stops the reaper goroutine. Exec calls still running then never
// learn their exit status: stop the server first.
func (r *Reaper) Close() {
	signal.Stop(r.sigc)
	close(r.stop)
	<-r.done
}

func (r *Reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr, beforeReap func(pid int)) (*child, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return nil, err
	}
	c := newChild(pid, beforeReap)
	r.children[pid] = c
	return c, nil
}

func (r *Reaper) loop() {
	defer close(r.done)
	for {
		r.reapAll()
		select {
		case <-r.sigc:
		case <-r.stop:
			return
		}
	}
}

// reapAll reaps every child that has exited. Signals coalesce, so one
// SIGCHLD may stand for many exits.
func (r *Reaper) reapAll() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		pid := siginfoPid(&info)
		if err != nil || pid == 0 {
			return // ECHILD (no children) or none has exited
		}
		r.mu.Lock()
		c, ok := r.children[pid]
		delete(r.children, pid)
		if ok {
			c.reap()
		} else {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		r.mu.Unlock()
	}
}
