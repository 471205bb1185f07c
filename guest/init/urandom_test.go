package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestURandom: each connection gets size bytes, and two connections get
// different ones (the host's RNG here; in a guest, the kernel's). The read
// is pinned to a CPU this test may run on; the reseed needs root.
func TestURandom(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !set.IsSet(cpu) {
		cpu++
	}
	reseed := 0
	if os.Geteuid() == 0 {
		reseed = 1
	}
	f := newFakeNet(t)
	got := make(chan []byte, 2)
	go func() {
		for range 2 {
			c := f.connect(t, 1024)
			if c == nil {
				got <- nil
				continue
			}
			b, err := io.ReadAll(c)
			if err != nil {
				t.Errorf("read: %v", err)
			}
			c.Close()
			got <- b
		}
	}()
	ok, details := run(t, f, fmt.Sprintf("microvm.scenarios=urandom microvm.urandom.conns=2 microvm.urandom.size=48 microvm.urandom.cpu=%d microvm.urandom.reseed=%d", cpu, reseed))
	wantOK(t, ok, details, fmt.Sprintf("conns=2 bytes=96 reseeded=%v", reseed == 1))
	a, b := <-got, <-got
	if len(a) != 48 || len(b) != 48 || bytes.Equal(a, b) {
		t.Errorf("connections got % x and % x: want 48 different bytes each", a, b)
	}
}

func TestURandomDefaultsToOneConnectionOf32Bytes(t *testing.T) {
	f := newFakeNet(t)
	got := make(chan []byte, 1)
	go func() {
		c := f.connect(t, 1024)
		if c == nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	ok, details := run(t, f, "microvm.scenarios=urandom microvm.urandom.reseed=0 microvm.urandom.cpu=-1")
	wantOK(t, ok, details, "conns=1 bytes=32 reseeded=false")
	if b := <-got; len(b) != defaultRandomSize {
		t.Errorf("got %d bytes, want %d", len(b), defaultRandomSize)
	}
}

func TestURandomBadParameters(t *testing.T) {
	for _, tc := range []struct{ cmdline, want string }{
		{"microvm.urandom.size=0", "bad parameter size=0"},
		{"microvm.urandom.size=2M", "bad parameter size=2097152"},
		{"microvm.urandom.reseed=2", "microvm.urandom.reseed"},
		{"microvm.urandom.cpu=-2", "microvm.urandom.cpu"},
		{"microvm.urandom.uptime=100000h", "waiting for 100000h0m0s of uptime"},
	} {
		ok, details := run(t, newFakeNet(t), "microvm.scenarios=urandom microvm.timeout=1s "+tc.cmdline)
		wantFail(t, ok, details, tc.want)
	}
}
