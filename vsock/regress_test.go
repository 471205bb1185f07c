package vsock_test

import (
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// Regression: an RX buffer with room for a header but none for data made
// the RX worker retry it forever when host data was pending (emitData
// undid the buffer and reported "nothing to read", the connection stayed
// ready), spinning a CPU and hanging Reset. Such a buffer now stops the
// device like one too small for a header.
func TestRegressionHeaderOnlyRxBufferSpins(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: 8}})
	e.allowFail = true
	c, h := e.connectGuest(5000, 1025)
	e.g.AutoRepost = false
	for e.g.RxPosted() > 0 {
		// Use up the normal buffers.
		c.CreditRequest()
		e.g.Sync()
		e.g.Poll()
	}
	e.g.PostRXSized(4, vsock.HeaderSize, 1)
	// Control packets fit.
	c.CreditRequest()
	n := c.CountCtl(vsock.OpCreditUpdate)
	e.g.WaitFor("CREDIT_UPDATE in a header-only buffer", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > n })
	hostWrite(t, h, []byte("data with nowhere to go"))
	e.g.WaitFail()
	reset := make(chan struct{})
	go func() {
		e.dev.Reset()
		close(reset)
	}()
	select {
	case <-reset:
	case <-time.After(waitTimeout):
		t.Fatal("Reset hangs: the RX worker is stuck on a header-only RX buffer")
	}
}
