// Package eventfd wraps Linux eventfds, the signalling primitive shared by
// KVM (ioeventfd kicks, irqfd interrupts), vhost-user (kick and call fds) and
// the device workers that wait on them.
package eventfd

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// EventFD is an eventfd counter. Signal may be called from any goroutine;
// Wait by the one goroutine that consumes the events. Close must not race
// with either: the descriptor number could be reused at once, so owners
// close an EventFD only after its signallers and waiter have stopped (or,
// as vhost-user's call eventfds, under a lock the signallers hold).
type EventFD struct {
	fd   int
	once sync.Once
}

// New creates a blocking eventfd (a consumer's Wait sleeps in read(2)).
func New() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &EventFD{fd: fd}, nil
}

// NewNonblocking creates an eventfd whose reads never block, for callers that
// poll it with epoll.
func NewNonblocking() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &EventFD{fd: fd}, nil
}

// FromFD adopts an eventfd received from elsewhere (vhost-user SET_VRING_KICK
// and SET_VRING_CALL). The EventFD owns fd from then on.
func FromFD(fd int) *EventFD { return &EventFD{fd: fd} }

// FD is the descriptor, for registration with KVM or epoll.
func (e *EventFD) FD() int { return e.fd }

// Signal adds 1 to the counter, waking a waiter.
func (e *EventFD) Signal() error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 1)
	for {
		_, err := unix.Write(e.fd, b[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil // counter saturated: the waiter will wake anyway
		}
		if err != nil {
			return fmt.Errorf("eventfd: signal: %w", err)
		}
		return nil
	}
}

// Wait blocks until the counter is non-zero, resets it and returns its value.
// On a non-blocking eventfd it returns 0, nil when nothing is pending.
func (e *EventFD) Wait() (uint64, error) {
	var b [8]byte
	for {
		_, err := unix.Read(e.fd, b[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("eventfd: wait: %w", err)
		}
		return binary.LittleEndian.Uint64(b[:]), nil
	}
}

// Close closes the descriptor. It is idempotent.
func (e *EventFD) Close() error {
	var err error
	e.once.Do(func() { err = unix.Close(e.fd) })
	return err
}

// PollStop is the device workers' wait: it clears the Revents of fds,
// polls them (timeoutMs < 0: no timeout), retrying on EINTR, and reports
// whether the last one, by convention the worker's stop eventfd, fired.
// The caller reads the other Revents itself.
func PollStop(fds []unix.PollFd, timeoutMs int) (stopped bool, err error) {
	for i := range fds {
		fds[i].Revents = 0
	}
	for {
		_, err := unix.Poll(fds, timeoutMs)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("eventfd: poll: %w", err)
		}
		return fds[len(fds)-1].Revents != 0, nil
	}
}
