package eventfd

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestSignalWait(t *testing.T) {
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := 0; i < 3; i++ {
		if err := e.Signal(); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.Wait()
	if err != nil || n != 3 {
		t.Fatalf("Wait = %d, %v; want 3", n, err)
	}
	nb, err := NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Close()
	if n, err := nb.Wait(); n != 0 || err != nil {
		t.Fatalf("empty non-blocking Wait = %d, %v", n, err)
	}
}

// TestPollStop: a signalled fd wakes PollStop without "stopped"; the last
// fd, signalled, reports stopped; a timeout returns neither.
func TestPollStop(t *testing.T) {
	kick, err := NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	defer kick.Close()
	stop, err := NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	defer stop.Close()
	fds := []unix.PollFd{{Fd: int32(kick.FD()), Events: unix.POLLIN}, {Fd: int32(stop.FD()), Events: unix.POLLIN}}
	if stopped, err := PollStop(fds, 10); err != nil || stopped || fds[0].Revents != 0 {
		t.Fatalf("timeout: stopped %v, kick revents %#x, %v", stopped, fds[0].Revents, err)
	}
	kick.Signal()
	if stopped, err := PollStop(fds, -1); err != nil || stopped || fds[0].Revents == 0 {
		t.Fatalf("kick: stopped %v, kick revents %#x, %v", stopped, fds[0].Revents, err)
	}
	kick.Wait()
	stop.Signal()
	if stopped, err := PollStop(fds, -1); err != nil || !stopped {
		t.Fatalf("stop: stopped %v, %v", stopped, err)
	}
}
