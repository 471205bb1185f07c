package virtio

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// fakeSession counts its stops; onStop runs inside Stop.
type fakeSession struct {
	stops  atomic.Int32
	onStop func()
}

func (s *fakeSession) Stop() {
	if s.onStop != nil {
		s.onStop()
	}
	s.stops.Add(1)
}

// TestLifecycle walks the states: activate, a second activate refused,
// reset stops the session once, activate again, close stops it and refuses
// every later activation, a second close reports it was not the first.
func TestLifecycle(t *testing.T) {
	l := Lifecycle[*fakeSession]{Name: "dev"}
	if _, ok := l.Current(); ok {
		t.Fatal("a new Lifecycle has a session")
	}
	l.Reset() // nothing to stop
	s1 := &fakeSession{}
	if err := l.Activate(func() (*fakeSession, error) { return s1, nil }); err != nil {
		t.Fatal(err)
	}
	if got, ok := l.Current(); !ok || got != s1 {
		t.Fatalf("Current = %v, %v; want the session", got, ok)
	}
	err := l.Activate(func() (*fakeSession, error) { t.Error("start called while active"); return nil, nil })
	if err == nil || err.Error() != "dev: activated twice without a reset" {
		t.Errorf("second Activate: %v", err)
	}
	l.Reset()
	l.Reset()
	if n := s1.stops.Load(); n != 1 {
		t.Errorf("session stopped %d times, want 1", n)
	}
	boom := errors.New("boom")
	if err := l.Activate(func() (*fakeSession, error) { return nil, boom }); err != boom {
		t.Errorf("Activate with a failing start: %v, want %v", err, boom)
	}
	if _, ok := l.Current(); ok {
		t.Error("a failed start left a session")
	}
	s2 := &fakeSession{}
	if err := l.Activate(func() (*fakeSession, error) { return s2, nil }); err != nil {
		t.Fatal(err)
	}
	if !l.Close() {
		t.Error("first Close reported the device closed before")
	}
	if n := s2.stops.Load(); n != 1 {
		t.Errorf("Close stopped the session %d times, want 1", n)
	}
	if l.Close() {
		t.Error("second Close reported it closed the device")
	}
	err = l.Activate(func() (*fakeSession, error) { t.Error("start called after Close"); return nil, nil })
	if !errors.Is(err, ErrClosed) || err.Error() != "dev: device closed" {
		t.Errorf("Activate after Close: %v", err)
	}
	if !l.Closed() {
		t.Error("Closed = false after Close")
	}
}

// TestLifecycleStopOutsideLock: a session's Stop may use the Lifecycle
// (its workers read Current on the way out) without deadlocking.
func TestLifecycleStopOutsideLock(t *testing.T) {
	var l Lifecycle[*fakeSession]
	s := &fakeSession{}
	s.onStop = func() { _, _ = l.Current() }
	if err := l.Activate(func() (*fakeSession, error) { return s, nil }); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { l.Reset(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Reset deadlocked with a Stop that reads Current")
	}
}

// TestLifecycleWait: Wait returns the session once one starts, times out
// with ErrNotReady, and returns ErrClosed as soon as Close runs.
func TestLifecycleWait(t *testing.T) {
	var l Lifecycle[*fakeSession]
	if _, err := l.Wait(time.Now().Add(10 * time.Millisecond)); !errors.Is(err, ErrNotReady) {
		t.Errorf("Wait with no session: %v, want ErrNotReady", err)
	}
	s := &fakeSession{}
	got := make(chan error, 1)
	go func() {
		w, err := l.Wait(time.Now().Add(time.Minute))
		if err == nil && w != s {
			err = errors.New("Wait returned another session")
		}
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := l.Activate(func() (*fakeSession, error) { return s, nil }); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("Wait across Activate: %v", err)
	}
	l.Reset()
	go func() {
		_, err := l.Wait(time.Now().Add(time.Minute))
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	l.Close()
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Errorf("Wait across Close: %v, want ErrClosed", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Close released Wait after %v", d)
	}
}
