package vmm

import (
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/kvm"
)

// TestVCPUCounters: exits land in their reason's slot (reasons past the
// table in the last one), and the CPU time is the thread's, frozen when
// the vCPU's goroutine ends.
func TestVCPUCounters(t *testing.T) {
	m := NewCountersOnly(1)
	c := m.vcpuCtrs[0]
	if got := m.Metrics().VCPUs[0]; got.CPUTime != 0 || len(got.Exits) != 0 {
		t.Errorf("before the vCPU started: %+v, want zero", got)
	}
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		// As runVCPU: the thread is locked, and never unlocked, so its
		// clock counts this goroutine alone and ends with it.
		runtime.LockOSThread()
		c.bind()
		defer c.unbind()
		for _, r := range []kvm.ExitReason{kvm.ExitIO, kvm.ExitIO, kvm.ExitMMIO, 200, ExitSlots - 1} {
			c.exit(r)
		}
		// Burn CPU until told to stop, so the thread's clock moves.
		for x := 0; ; x++ {
			select {
			case <-stop:
				return
			default:
			}
			if x%1000 == 0 {
				time.Sleep(0) // stay preemptible
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	var running time.Duration
	for running < 20*time.Millisecond && time.Now().Before(deadline) {
		running = m.Metrics().VCPUs[0].CPUTime
		time.Sleep(5 * time.Millisecond)
	}
	if running < 20*time.Millisecond {
		t.Fatalf("the busy thread's CPU time read %v after 10 s", running)
	}
	close(stop)
	<-done
	final := m.Metrics().VCPUs[0]
	if final.CPUTime < running {
		t.Errorf("CPU time went down from %v to %v when the goroutine ended", running, final.CPUTime)
	}
	time.Sleep(20 * time.Millisecond)
	if again := m.Metrics().VCPUs[0].CPUTime; again != final.CPUTime {
		t.Errorf("CPU time moved from %v to %v after the goroutine ended", final.CPUTime, again)
	}
	want := map[kvm.ExitReason]uint64{kvm.ExitIO: 2, kvm.ExitMMIO: 1, ExitSlots - 1: 2}
	if diff := cmp.Diff(want, final.Exits); diff != "" {
		t.Errorf("exits (-want +got):\n%s", diff)
	}
}
