package microvm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestPool: a pool of clones of the echo guest's snapshot hands out
// running clones, each with the host resources Host gave it and ready
// (Ready's WaitAgent had a connection accepted), refills itself past its
// size, and refuses Get once closed; a clone that is never ready is not
// handed out, its error is.
func TestPool(t *testing.T) {
	// Two connections a clone: Ready's, then the test's echo.
	g := newVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=2", vsockTestPort))
	g.start()
	g.waitListening(vsockTestPort)
	dir := filepath.Join(t.TempDir(), "snap")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{Stop: true}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	socks, err := os.MkdirTemp("", "mvpool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(socks) })
	_, log := newGuestHost(t)
	var readied atomic.Int32
	pool, err := microvm.NewPool(dir, microvm.PoolOptions{
		Size: 2,
		Host: func(n int) microvm.Config {
			return microvm.Config{Log: log, Vsock: &microvm.VsockConfig{CID: uint64(10 + n), UDSPath: filepath.Join(socks, fmt.Sprintf("c%d", n))}}
		},
		Ready: func(ctx context.Context, m *microvm.Machine) error {
			conn, err := m.WaitAgent(ctx, vsockTestPort, 30*time.Second)
			if err != nil {
				return err
			}
			readied.Add(1)
			return conn.Close()
		},
	})
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	defer pool.Close()
	cids := map[uint64]bool{}
	for i := range 3 { // one more than the pool holds: it refills
		c, err := pool.Get(ctx)
		if err != nil {
			t.Fatalf("Get %d: %v", i, err)
		}
		v := c.Config().Vsock
		if cids[v.CID] {
			t.Errorf("clone %d has CID %d, as an earlier one", i, v.CID)
		}
		cids[v.CID] = true
		conn, _, err := testenv.VsockConnect(v.UDSPath, vsockTestPort, 30*time.Second)
		if err != nil {
			c.Stop()
			t.Fatalf("clone %d: connect: %v", i, err)
		}
		msg := fmt.Sprintf("clone %d\n", i)
		conn.Write([]byte(msg))
		got := make([]byte, len(msg))
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(conn, got); err != nil || string(got) != msg {
			t.Errorf("clone %d echoed %q, %v; want %q", i, got, err, msg)
		}
		conn.Close()
		res, err := c.Wait()
		if err != nil || res.Kind != microvm.ExitDebugPort || res.Status != 0 {
			t.Errorf("clone %d ended with %+v, %v; want the guest's exit 0", i, res, err)
		}
	}
	if n := readied.Load(); n < 3 {
		t.Errorf("Ready called %d times for 3 clones handed out", n)
	}
	pool.Close()
	if _, err := pool.Get(ctx); !errors.Is(err, microvm.ErrPoolClosed) {
		t.Errorf("Get after Close: %v; want ErrPoolClosed", err)
	}

	bad, err := microvm.NewPool(dir, microvm.PoolOptions{Host: func(n int) microvm.Config {
		return microvm.Config{Log: log, Vsock: &microvm.VsockConfig{CID: uint64(20 + n), UDSPath: filepath.Join(socks, fmt.Sprintf("b%d", n))}}
	}, Ready: func(ctx context.Context, m *microvm.Machine) error { return errors.New("no agent") }})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if c, err := bad.Get(ctx); c != nil || err == nil || !strings.Contains(err.Error(), "no agent") {
		t.Errorf("Get from a pool whose clones are never ready: %v, %v; want the Ready error", c, err)
	}
	if _, err := microvm.NewPool(t.TempDir(), microvm.PoolOptions{}); err == nil {
		t.Error("NewPool of a directory without a snapshot: no error")
	}
}
