package consoletest

import (
	"testing"
	"time"
)

// TestWaitFor: a waiter wakes on the write that completes its text, even
// when the text arrives in pieces; done ends the wait with what is there;
// the deadline ends it with false.
func TestWaitFor(t *testing.T) {
	c := New()
	got := make(chan bool, 1)
	go func() { got <- c.WaitFor("ready\n", time.Minute, nil) }()
	for _, p := range []string{"boot\nrea", "dy", "\n"} {
		time.Sleep(time.Millisecond)
		_, _ = c.Write([]byte(p))
	}
	if !<-got {
		t.Error("WaitFor(ready) = false after it was written")
	}
	if c.String() != "boot\nready\n" {
		t.Errorf("String() = %q", c.String())
	}
	done := make(chan struct{})
	close(done)
	if c.WaitFor("never", time.Minute, done) {
		t.Error("WaitFor(never) with done closed = true")
	}
	if !c.WaitFor("boot", time.Minute, done) {
		t.Error("WaitFor(boot) with done closed = false; it is there")
	}
	if c.WaitFor("never", 10*time.Millisecond, nil) {
		t.Error("WaitFor(never) = true at the deadline")
	}
}
