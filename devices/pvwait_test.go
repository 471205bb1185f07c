package devices

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// wait32 performs a 32-bit out of us to the port and returns how long it
// blocked.
func wait32(w *PVWait, us uint32) time.Duration {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, us)
	start := time.Now()
	w.Write(0, b)
	return time.Since(start)
}

// slack bounds scheduling delay in the timing checks below: generous, since
// CI machines have two cores and tests run with -race.
const slack = 2 * time.Second

func TestPVWaitTimeout(t *testing.T) {
	tests := []struct {
		name string
		us   uint32
		want time.Duration
	}{
		{"0 means 1 ms", 0, PVWaitDefault},
		{"5 ms", 5000, 5 * time.Millisecond},
		{"exactly the cap", 100_000, PVWaitMax},
		{"capped at 100 ms", 0xffffffff, PVWaitMax},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := NewPVWait()
			got := wait32(w, tc.us)
			if got < tc.want || got > tc.want+slack {
				t.Errorf("wait of %d us blocked %v, want %v (+ scheduling)", tc.us, got, tc.want)
			}
			if waits, wakeups := w.Stats(); waits != 1 || wakeups != 0 {
				t.Errorf("Stats() = %d waits, %d wakeups; want 1, 0", waits, wakeups)
			}
		})
	}
}

// TestPVWaitSticky: a Notify that lands before the wait (the guest checked its
// rings, then the device interrupted, then the guest waits) is not lost.
func TestPVWaitSticky(t *testing.T) {
	w := NewPVWait()
	w.Notify()
	w.Notify() // several notifications before a wait count once
	if d := wait32(w, 100_000); d > slack {
		t.Errorf("wait after Notify blocked %v, want an immediate return", d)
	}
	// The flag was consumed: the next wait times out.
	if d := wait32(w, 10_000); d < 10*time.Millisecond {
		t.Errorf("second wait returned after %v, want the 10 ms timeout (notification consumed once)", d)
	}
	if waits, wakeups := w.Stats(); waits != 2 || wakeups != 1 {
		t.Errorf("Stats() = %d waits, %d wakeups; want 2, 1", waits, wakeups)
	}
}

func TestPVWaitNotifyWakesWaiter(t *testing.T) {
	w := NewPVWait()
	done := make(chan time.Duration, 1)
	go func() { done <- wait32(w, 100_000) }()
	// Notify until the waiter returns: a Notify that beats the waiter's
	// registration is caught by the sticky flag, one after it by the wake-up.
	time.Sleep(5 * time.Millisecond)
	w.Notify()
	select {
	case d := <-done:
		if d >= PVWaitMax {
			t.Errorf("waiter returned after %v: woken by its timeout, not by Notify", d)
		}
	case <-time.After(slack):
		t.Fatal("Notify did not wake the waiter")
	}
	if _, wakeups := w.Stats(); wakeups != 1 {
		t.Errorf("wakeups = %d, want 1", wakeups)
	}
}

func TestPVWaitClose(t *testing.T) {
	w := NewPVWait()
	const waiters = 3
	done := make(chan time.Duration, waiters)
	for range waiters {
		go func() { done <- wait32(w, 100_000) }()
	}
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	w.Close()
	for range waiters {
		select {
		case <-done:
		case <-time.After(slack):
			t.Fatal("Close did not release every waiter")
		}
	}
	if d := time.Since(start); d >= PVWaitMax {
		t.Errorf("waiters released %v after Close, want at once", d)
	}
	// After Close a wait returns at once, and Close is idempotent.
	w.Close()
	if d := wait32(w, 100_000); d >= PVWaitMax {
		t.Errorf("wait after Close blocked %v, want an immediate return", d)
	}
}

func TestPVWaitNarrowWrites(t *testing.T) {
	w := NewPVWait()
	start := time.Now()
	w.Write(0, []byte{2}) // an 8-bit out: 2 us
	w.Write(0, nil)       // zero width: the 1 ms default
	if d := time.Since(start); d < PVWaitDefault || d > slack {
		t.Errorf("two narrow waits took %v", d)
	}
	b := []byte{9, 9, 9, 9}
	w.Read(0, b)
	if !bytes.Equal(b, make([]byte, 4)) {
		t.Errorf("read = %x, want zeros", b)
	}
}
