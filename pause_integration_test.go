package microvm_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/kvm"
)

// exitsTotal sums every vCPU's exits.
func exitsTotal(m *microvm.Machine) uint64 {
	var n uint64
	for _, v := range m.Metrics().VCPUs {
		for _, c := range v.Exits {
			n += c
		}
	}
	return n
}

// TestPauseResume: a paused machine's vCPUs leave the guest and stay out
// (no exit is counted while paused, though the echo guest polls its wait
// port at least every 100 ms), the machine resumes, and a vsock echo works
// afterwards; Pause before Run and after the end is ErrNotRunning. On the
// same guest, PeekVCPUs (which must not need a pause) finds every vCPU
// inside the test guest's image, and DeviceStatuses the vsock driver
// running.
func TestPauseResume(t *testing.T) {
	g := newVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	if err := g.m.Pause(context.Background()); !errors.Is(err, microvm.ErrNotRunning) {
		t.Errorf("Pause before Run: %v, want ErrNotRunning", err)
	}
	g.start()
	g.waitListening(vsockTestPort)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checkPeek(t, g.m)
	if err := g.m.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if !g.m.Paused() {
		t.Error("Paused() = false after Pause")
	}
	before := exitsTotal(g.m)
	time.Sleep(300 * time.Millisecond)
	// One exit may still be counted: a vCPU kicked while handling one
	// counts the interrupted KVM_RUN as it parks.
	if after := exitsTotal(g.m); after > before+uint64(len(g.m.Metrics().VCPUs)) {
		t.Errorf("%d exits while paused", after-before)
	}
	if err := g.m.Pause(ctx); err != nil {
		t.Errorf("Pause when paused: %v", err)
	}
	if _, err := g.m.PeekVCPUs(ctx); err == nil {
		t.Error("PeekVCPUs of a paused machine succeeded; its vCPUs are parked, not between exits")
	}
	if err := g.m.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(c, randomBytes(t, 1<<20)); err != nil {
		t.Fatalf("echo after resume: %v; console:\n%s", err, g.console)
	}
	c.Close()
	g.wait(0, 30*time.Second)
	if err := g.m.Resume(); !errors.Is(err, microvm.ErrNotRunning) {
		t.Errorf("Resume after the end: %v, want ErrNotRunning", err)
	}
	if _, err := g.m.PeekVCPUs(ctx); !errors.Is(err, microvm.ErrNotRunning) {
		t.Errorf("PeekVCPUs after the end: %v, want ErrNotRunning", err)
	}
	if n := g.m.Metrics().VCPUs[0].Exits[kvm.ExitIO]; n == 0 {
		t.Error("no I/O exits counted: the guest never ran")
	}
}

// checkPeek peeks at a running test guest twice (a second request must be
// answered as well as the first): one answer per vCPU, in order, each
// instruction pointer inside the guest's image (linked at 1 MiB,
// guest/testguest/link.ld, well under 2 MiB long), RFLAGS' always-one bit
// set; and the vsock device's status is DRIVER_OK's 0xf.
func checkPeek(t *testing.T, m *microvm.Machine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := 0; round < 2; round++ {
		vcpus, err := m.PeekVCPUs(ctx)
		if err != nil {
			t.Fatalf("PeekVCPUs: %v", err)
		}
		if want := len(m.Metrics().VCPUs); len(vcpus) != want {
			t.Fatalf("PeekVCPUs: %d answers, want %d", len(vcpus), want)
		}
		for i, v := range vcpus {
			if v.ID != i || v.RIP < 1<<20 || v.RIP >= 3<<20 || v.RFLAGS&2 == 0 {
				t.Errorf("PeekVCPUs[%d] = %s: want vCPU %d inside the image at 1 MiB", i, v, i)
			}
		}
		t.Logf("peek %d: %v", round, vcpus)
	}
	if st := m.DeviceStatuses(); !strings.Contains(st, "vsock=0xf") {
		t.Errorf("DeviceStatuses = %q, want vsock=0xf", st)
	}
}
