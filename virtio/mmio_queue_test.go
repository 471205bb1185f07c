package virtio_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
)

// TestMMIOQueueReadyValidates checks that setting QueueReady validates the
// queue (4.2.3.2) and that a bad queue is a guest error that needs a reset.
func TestMMIOQueueReadyValidates(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *virtio.QueueConfig)
		ok     bool
	}{
		{"good", func(c *virtio.QueueConfig) {}, true},
		{"desc 8-aligned", func(c *virtio.QueueConfig) { c.Desc += 8 }, false},
		{"avail odd", func(c *virtio.QueueConfig) { c.Avail++ }, false},
		{"used 2-aligned", func(c *virtio.QueueConfig) { c.Used += 2 }, false},
		{"desc above 4 GiB", func(c *virtio.QueueConfig) { c.Desc += 1 << 32 }, false},
		{"used past the end of memory", func(c *virtio.QueueConfig) { c.Used = 1<<20 - 8 }, false},
		{"avail outside memory", func(c *virtio.QueueConfig) { c.Avail = 1 << 20 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMEnv(t, newFakeDevice())
			cfg := e.driverQueues(false, 64)[0].Cfg
			tt.mutate(&cfg)
			if !e.negotiate(virtio.FeatureVersion1) {
				t.Fatal("FEATURES_OK did not stick")
			}
			e.setupQueue(0, cfg)
			wantReady, wantStatus, wantErrs, wantInt := uint32(1), uint32(11), uint64(0), uint32(0)
			if !tt.ok {
				wantReady, wantStatus, wantErrs, wantInt = 0, 11|virtio.StatusNeedsReset, 1, virtio.IntConfigChange
			}
			type regs struct {
				Ready, Status, IntStatus uint32
				GuestErrors              uint64
			}
			want := regs{wantReady, wantStatus, wantInt, wantErrs}
			got := regs{e.r(virtio.RegQueueReady), e.r(virtio.RegStatus), e.r(virtio.RegInterruptStatus), e.m.GuestErrors()}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after QueueReady (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMMIOQueueNumDefaultsToMax(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	cfg := e.driverQueues(false, 256)[0].Cfg
	e.negotiate(virtio.FeatureVersion1)
	e.w(virtio.RegQueueSel, 0)
	e.w(virtio.RegQueueDescLow, uint32(cfg.Desc))
	e.w(virtio.RegQueueDriverLow, uint32(cfg.Avail))
	e.w(virtio.RegQueueDeviceLow, uint32(cfg.Used))
	e.w(virtio.RegQueueReady, 1)
	if n := e.r(virtio.RegQueueNum); n != 256 {
		t.Errorf("QueueNum = %d; want QueueNumMax 256 when the driver never wrote it", n)
	}
	e.addStatus(virtio.StatusDriverOK)
	if got := dev.lastActivation(t).Queues[0].Size(); got != 256 {
		t.Errorf("activated queue size %d; want 256", got)
	}
}

// TestMMIOQueueAddressHighWords places rings above 4 GiB so that the high
// address registers matter.
func TestMMIOQueueAddressHighWords(t *testing.T) {
	gm, err := guestmem.New(
		guestmem.Region{GPA: 0, Data: make([]byte, 1<<20)},
		guestmem.Region{GPA: 1 << 32, Data: make([]byte, 1<<20)},
	)
	if err != nil {
		t.Fatal(err)
	}
	dev := newFakeDevice()
	e := &menv{dev: dev}
	e.m = newMMIO(t, dev, gm, func() { e.raised.Add(1) })
	cfg := virtio.QueueConfig{Size: 64, Desc: 1<<32 + 0x1000, Avail: 0x2000, Used: 1<<32 + 0x3000}
	e.negotiate(virtio.FeatureVersion1)
	e.w(virtio.RegQueueSel, 0)
	e.w(virtio.RegQueueDescHigh, 0xdead) // overwritten below
	e.setupQueue(0, cfg)
	e.addStatus(virtio.StatusDriverOK)
	if diff := cmp.Diff(cfg, dev.lastActivation(t).Queues[0].Config()); diff != "" {
		t.Errorf("activated queue config (-want +got):\n%s", diff)
	}
}

// TestMMIOQueueRegisterMisuse walks through register misuse around queue
// setup; each step says how many guest errors it adds.
func TestMMIOQueueRegisterMisuse(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	qs := e.driverQueues(false, 64, 64)
	cfg := qs[0].Cfg
	steps := []struct {
		name string
		do   func()
		errs uint64 // guest errors added
	}{
		{"status ACKNOWLEDGE|DRIVER", func() { e.addStatus(1); e.addStatus(2) }, 0},
		{"QueueNum before FEATURES_OK", func() { e.w(virtio.RegQueueNum, 64) }, 1},
		{"QueueReady before FEATURES_OK", func() { e.w(virtio.RegQueueReady, 1) }, 1},
		{"FEATURES_OK", func() { e.writeFeatures(virtio.FeatureVersion1); e.addStatus(8) }, 0},
		{"select queue 5", func() { e.w(virtio.RegQueueSel, 5) }, 0},
		{"QueueNum of queue 5", func() { e.w(virtio.RegQueueNum, 64) }, 1},
		{"QueueDescLow of queue 5", func() { e.w(virtio.RegQueueDescLow, 0x1000) }, 1},
		{"QueueReady of queue 5", func() { e.w(virtio.RegQueueReady, 1) }, 1},
		{"select queue 0", func() { e.w(virtio.RegQueueSel, 0) }, 0},
		{"QueueNum 64", func() { e.w(virtio.RegQueueNum, 64) }, 0},
		{"QueueNum 0", func() { e.w(virtio.RegQueueNum, 0) }, 1},
		{"QueueNum 3", func() { e.w(virtio.RegQueueNum, 3) }, 1},
		{"QueueNum 512 above max", func() { e.w(virtio.RegQueueNum, 512) }, 1},
		{"QueueNum 1<<31", func() { e.w(virtio.RegQueueNum, 1<<31) }, 1},
		{"queue 0 ready", func() { e.setupQueue(0, cfg) }, 0},
		{"QueueNum while ready", func() { e.w(virtio.RegQueueNum, 32) }, 1},
		{"QueueDescLow while ready", func() { e.w(virtio.RegQueueDescLow, 0) }, 1},
		{"QueueReady 0 before DRIVER_OK", func() { e.w(virtio.RegQueueReady, 0) }, 0},
		{"queue 0 ready again", func() { e.setupQueue(0, cfg) }, 0},
		{"write Magic", func() { e.w(virtio.RegMagic, 0) }, 1},
		{"write QueueNumMax", func() { e.w(virtio.RegQueueNumMax, 8) }, 1},
		{"write reserved 0x0f8", func() { e.w(0x0f8, 1) }, 1},
		{"write ConfigGeneration", func() { e.w(virtio.RegConfigGeneration, 1) }, 1},
		{"read write-only registers", func() {
			for _, r := range []uint64{virtio.RegQueueNotify, virtio.RegInterruptACK, virtio.RegDriverFeatures, 0x0f8} {
				if v := e.r(r); v != 0 {
					t.Errorf("register %#x reads %#x; want 0", r, v)
				}
			}
		}, 0},
		{"DRIVER_OK", func() { e.addStatus(4) }, 0},
		{"QueueReady 0 while running", func() { e.w(virtio.RegQueueReady, 0) }, 1},
		{"QueueNum while running", func() { e.w(virtio.RegQueueNum, 64) }, 1},
		{"queue 1 set up while running", func() { e.setupQueue(1, qs[1].Cfg) }, 8},
	}
	var prev uint64
	for _, s := range steps {
		s.do()
		if got := e.m.GuestErrors() - prev; got != s.errs {
			t.Errorf("%s: %d guest errors; want %d", s.name, got, s.errs)
		}
		prev = e.m.GuestErrors()
	}
	if s := e.r(virtio.RegStatus); s != 15 {
		t.Errorf("status = %s; register misuse must not need a reset", virtio.StatusString(s))
	}
	a := dev.lastActivation(t)
	if a.Queues[1] != nil {
		t.Error("queue 1, set up after DRIVER_OK, was activated")
	}
	if diff := cmp.Diff(cfg, a.Queues[0].Config()); diff != "" {
		t.Errorf("queue 0 config (-want +got):\n%s", diff)
	}
	e.w(virtio.RegQueueSel, 0)
	if r := e.r(virtio.RegQueueReady); r != 1 {
		t.Errorf("queue 0 not ready after a refused disable")
	}
}

// worker imitates a device worker that reports guest errors and interrupts
// until Reset stops it.
type worker struct {
	stop chan struct{}
	done chan struct{}
}

// TestMMIOFailWhileResetting runs, under -race, the vCPU side initialising
// and resetting the device while its worker and another goroutine call Fail
// and raise interrupts, and Reset itself reports an error through Fail. It
// must not deadlock.
func TestMMIOFailWhileResetting(t *testing.T) {
	dev := newFakeDevice()
	var mu sync.Mutex
	var w *worker
	var fail func(error)
	dev.onActivate = func(a virtio.Activation) {
		mu.Lock()
		defer mu.Unlock()
		w = &worker{stop: make(chan struct{}), done: make(chan struct{})}
		fail = a.Fail
		go func(w *worker) {
			defer close(w.done)
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				a.Fail(errors.New("worker: bad descriptor"))
				if q := a.Queues[0]; q != nil {
					q.Interrupt()
				}
			}
		}(w)
	}
	dev.onReset = func() {
		mu.Lock()
		cur, f := w, fail
		mu.Unlock()
		close(cur.stop)
		<-cur.done
		f(errors.New("reset: the device noticed late")) // with MMIO.mu held
	}
	e := newMEnv(t, dev)
	qcfg := e.driverQueues(false, 64)[0].Cfg

	stop := make(chan struct{})
	var others sync.WaitGroup
	others.Add(2)
	go func() { // an unrelated goroutine failing the device
		defer others.Done()
		for {
			select {
			case <-stop:
				return
			default:
				e.m.Fail(errors.New("backend gone"))
			}
		}
	}()
	go func() { // an interrupt handler on another vCPU
		defer others.Done()
		for {
			select {
			case <-stop:
				return
			default:
				e.w(virtio.RegInterruptACK, e.r(virtio.RegInterruptStatus))
			}
		}
	}()

	const rounds = 200
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := 0; i < rounds; i++ {
			// Explicit status values: a read-modify-write would carry
			// the NEEDS_RESET the other goroutines keep setting.
			e.w(virtio.RegStatus, 1)
			e.w(virtio.RegStatus, 3)
			e.writeFeatures(virtio.FeatureVersion1)
			e.w(virtio.RegStatus, 11)
			e.setupQueue(0, qcfg)
			e.w(virtio.RegStatus, 15)
			_ = e.r(virtio.RegInterruptStatus)
			e.w(virtio.RegStatus, 0)
		}
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock: the vCPU side did not finish its resets in 30 s")
	}
	close(stop)
	others.Wait()
	acts, resets, live := dev.counts()
	if acts == 0 || acts != resets || live != 0 {
		t.Errorf("activations %d, resets %d, live %d; want equal non-zero counts and 0 live", acts, resets, live)
	}
}
