package vsock_test

import (
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// A device reset with connections open and data flowing both ways closes
// every host socket and stops the workers; a new activation works.
func TestResetWhileBusy(t *testing.T) {
	for _, l := range guestLayouts[:2] {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: l.o})
			var hosts []net.Conn
			var conns []*vsocktest.Conn
			for i := uint32(0); i < 3; i++ {
				c, h := e.connectGuest(100+i, 2000+i)
				conns, hosts = append(conns, c), append(hosts, h)
				c2, h2 := e.connectHost(3000+i, nil)
				conns, hosts = append(conns, c2), append(hosts, h2)
			}
			// Each host end writes and reads until the device closes it.
			var wg sync.WaitGroup
			for _, h := range hosts {
				wg.Add(2)
				go func() {
					defer wg.Done()
					b := vsocktest.Pattern(1, 64<<10)
					_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
					for {
						if _, err := h.Write(b); err != nil {
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					_ = vsocktest.WaitEOF(h, waitTimeout)
				}()
			}
			// Traffic until a good part of a MiB went each way.
			out := vsocktest.Pattern(2, 1<<20)
			e.g.WaitFor("traffic both ways", func() bool {
				for _, c := range conns {
					c.TryWrite(out[:32<<10])
					c.Consume(c.Buffered())
				}
				s := e.dev.Stats()
				return s.TxBytes > 512<<10 && s.RxBytes > 512<<10
			})
			e.g.Reset()
			if s := e.dev.Stats(); s.ConnsOpen != 0 {
				t.Errorf("%d connections open after reset", s.ConnsOpen)
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(waitTimeout):
				t.Fatal("host sockets still open after the reset")
			}
			for _, h := range hosts {
				hostClosed(t, h)
			}
			e.g.Activate()
			c, h := e.connectGuest(100, 2000)
			e.transfer(c, h, vsocktest.Pattern(3, 100<<10), vsocktest.Pattern(4, 100<<10))
			c2, h2 := e.connectHost(3000, nil)
			e.transfer(c2, h2, vsocktest.Pattern(5, 100<<10), vsocktest.Pattern(6, 100<<10))
		})
	}
}

// A reset during a dial: the socket the dial returns later is closed, not
// leaked, and the dial's result never reaches the new activation.
func TestResetDuringDial(t *testing.T) {
	e := newEnv(t, envOpts{})
	release := make(chan struct{})
	e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Wait: release} }
	e.g.Dial(1, 2000)
	e.g.Sync()
	fds := openFDs(t)
	e.g.Reset()
	e.g.Activate()
	close(release)
	h := e.dial.Accept(waitTimeout)
	hostClosed(t, h)
	h.Close()
	e.g.Quiet(quietFor, "a packet from the old activation", func() bool { return len(e.g.Pending()) > 0 })
	waitFDs(t, fds)
}

// A reset while a host-initiated connection waits for the guest's answer
// closes the host socket; the connection's timer does nothing later.
func TestResetDuringHostConnect(t *testing.T) {
	e := newEnv(t, envOpts{})
	h, err := vsocktest.HostConnect(t, e.dev, 50, nil, time.Now().Add(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.g.WaitRequest(50)
	e.g.Reset()
	hostClosed(t, h)
	e.g.Activate()
	e.g.Quiet(100*time.Millisecond, "a packet after the reset", func() bool { return len(e.g.Pending()) > 0 })
}

// Activate without a reset is refused; activation after Close too.
func TestActivateTwice(t *testing.T) {
	e := newEnv(t, envOpts{})
	if err := e.dev.Activate(e.g.Activation); err == nil {
		t.Fatal("second Activate succeeded")
	}
	e.g.Reset()
	e.dev.Close()
	if err := e.dev.Activate(e.g.Activation); err == nil {
		t.Fatal("Activate after Close succeeded")
	}
}

// Many activations, each with traffic and a reset, leave no goroutine and
// no descriptor behind.
func TestResetCycles(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.g.Reset()
	fds := openFDs(t)
	for i := 0; i < 20; i++ {
		e.g.Activate()
		c, h := e.connectGuest(1, 2000)
		e.transfer(c, h, vsocktest.Pattern(uint64(i), 8<<10), vsocktest.Pattern(uint64(i+1), 8<<10))
		c2, h2 := e.connectHost(3000, []byte("p"))
		c2.Read(1)
		e.g.SendOp(vsock.OpRW, 9, 9, 0) // an RST owed
		hostWrite(t, h2, []byte("pending"))
		e.g.Reset()
		hostClosed(t, h)
		hostClosed(t, h2)
		h.Close()
		h2.Close()
	}
	waitFDs(t, fds)
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// waitFDs waits until no more descriptors are open than want.
func waitFDs(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		n := openFDs(t)
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open; want at most %d (leak)", n, want)
		}
		time.Sleep(time.Millisecond)
	}
}
