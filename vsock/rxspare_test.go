package vsock_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// TestRxSpareWakesRX races the two workers for the guest's last RX buffers,
// the case that once hung an agent exec: the TX worker's direct enqueue
// for a connection the guest just accepted pops every free buffer, and
// while it reads the new socket (which is empty) the RX worker finds none
// for another connection's host data and goes to sleep waiting for a guest
// kick. The guest posts nothing: it believes the device holds its buffers.
// The read finds nothing, the buffers go to the spare list, and whoever
// puts them there must wake the RX worker, or the data never arrives.
func TestRxSpareWakesRX(t *testing.T) {
	opts := vsock.DefaultOptions
	e := newEnv(t, envOpts{cfg: vsock.Config{Options: &opts}, guest: vsocktest.Options{RxBuffers: 8}})
	b, bh := e.connectGuest(5000, 6000)
	e.g.Sync()
	e.g.AutoRepost = false

	popped := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	vsock.SetRxReadHook(t, func(txWorker bool) {
		if !txWorker {
			return
		}
		once.Do(func() {
			close(popped)
			<-release
		})
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	// The guest accepts a host connection: the TX worker registers its
	// socket (readable until a read says otherwise) and reads it into
	// every RX buffer left, held in the hook.
	e.connectHost(7000, nil)
	select {
	case <-popped:
	case <-time.After(waitTimeout):
		t.Fatal("the TX worker never read the accepted connection's socket")
	}
	if out, spare, _ := e.dev.ProbeRX(); out == 0 || spare != 0 {
		t.Fatalf("want the TX worker holding the RX buffers: %d out, %d spare", out, spare)
	}

	// Host data for b now finds no RX buffer: the RX worker goes to sleep.
	full := e.dev.Stats().RxQueueFull
	data := bytes.Repeat([]byte("x"), 100)
	hostWrite(t, bh, data)
	deadline := time.Now().Add(waitTimeout)
	for {
		_, _, asleep := e.dev.ProbeRX()
		if e.dev.Stats().RxQueueFull > full && asleep {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the RX worker never ran out of buffers")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // into epoll_wait

	released = true
	close(release)
	if got := b.Read(len(data)); !bytes.Equal(got, data) {
		t.Fatalf("guest read %q; want %q", trunc(got), trunc(data))
	}
	e.g.Sync()
	if p := e.dev.Probe(); p.RxOut != p.RxSpare {
		t.Fatalf("RX buffers popped and not returned: %d, on the spare list: %d", p.RxOut, p.RxSpare)
	}
}
