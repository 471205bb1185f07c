package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testenv"
)

// KVM integration test of snapshots with the bundled test guest: a running
// machine is snapshotted and goes on, and the snapshot restored twice (in
// this process, beside the original) gives two machines that go on from
// the same point with their own vsock sockets and CIDs.

// restoreVsockGuest restores the snapshot in dir as a vsockGuest with its
// own host socket and CID (and the host settings adjust makes). Cleanup
// stops and closes it.
func restoreVsockGuest(t *testing.T, dir string, cid uint64, adjust ...func(*Config)) *vsockGuest {
	t.Helper()
	g, log := newGuestHost(t)
	host := Config{Console: g.console, Log: log, Vsock: &VsockConfig{CID: cid, UDSPath: g.uds}}
	for _, f := range adjust {
		f(&host)
	}
	var err error
	if g.m, err = Restore(dir, host); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	g.closeOnCleanup()
	return g
}

// TestSnapshotRestore: the echo guest, listening, is snapshotted while it
// runs; it goes on and serves an echo; each of two restores of the
// snapshot serves one too (the guest's state includes its listening
// socket, so it needs no new "listening" line) and exits as the original
// does. The snapshot is sparse: it takes far less disk than guest memory.
func TestSnapshotRestore(t *testing.T) {
	g := newVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	g.start()
	g.waitListening(vsockTestPort)
	dir := filepath.Join(t.TempDir(), "snap")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.m.Snapshot(ctx, dir, SnapshotOptions{Labels: map[string]string{"job": "echo"}}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if info, err := ReadSnapshot(dir); err != nil || info.Labels["job"] != "echo" || len(info.Labels) != 1 ||
		info.Config.MemoryBytes != g.m.Config().MemoryBytes || info.Created.IsZero() {
		t.Errorf("ReadSnapshot: %+v, %v; want the label job=echo, the machine's memory size and a creation time", info, err)
	}
	if g.m.Paused() {
		t.Error("the machine is still paused after Snapshot")
	}
	var used int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			used += fileBlocks(fi)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if used >= 64<<20/2 {
		t.Errorf("the snapshot of a 64 MiB guest takes %d KiB of disk; want it sparse", used>>10)
	}
	t.Logf("snapshot: %d KiB on disk for 64 MiB of guest memory", used>>10)

	echoOnce := func(g *vsockGuest, who string) {
		t.Helper()
		c, err := g.connect(vsockTestPort)
		if err != nil {
			t.Fatalf("%s: connect: %v; console:\n%s\nlog:\n%s", who, err, g.console, g.log)
		}
		if err := echo(c, randomBytes(t, 1<<20)); err != nil {
			t.Fatalf("%s: echo: %v; console:\n%s\nlog:\n%s", who, err, g.console, g.log)
		}
		c.Close()
		g.wait(0, 30*time.Second)
	}
	echoOnce(g, "original")
	for i, cid := range []uint64{4, 5} {
		// The second reads guest memory in at restore (PrefaultMemory).
		r := restoreVsockGuest(t, dir, cid, func(c *Config) { c.PrefaultMemory = i == 1 })
		r.start()
		echoOnce(r, fmt.Sprintf("restore %d", i+1))
		if got := r.m.cfg.Vsock.CID; got != cid {
			t.Errorf("restore %d runs with CID %d, want %d", i+1, got, cid)
		}
	}
}

// fileBlocks is the disk space a file takes (its allocated blocks).
func fileBlocks(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// TestSnapshotLinux: Linux (2 vCPUs, the split irqchip) with the Go /init
// listening on a vsock port is snapshotted while it waits; the original
// goes on and echoes 16 MiB; a restore with its own CID and socket echoes
// 16 MiB too, and then /init finishes and powers the machine off as it
// would have without the snapshot. The guest's listening socket survives
// the snapshot (only connected sockets are reset).
func TestSnapshotLinux(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	kernel, initrd := testenv.BzImage(t), testenv.Initrd(t)
	const port = 1024
	cmdline := fmt.Sprintf("%s microvm.scenarios=echo microvm.echo.port=%d microvm.echo.conns=1", linuxCmdline, port)
	g := newVsockGuestConfig(t, "", func(c *Config) {
		c.Kernel, c.Initrd, c.Cmdline, c.CPUs, c.MemoryBytes = kernel, initrd, cmdline, 2, 256<<20
	})
	g.start()
	listening := fmt.Sprintf("init: scenario echo listening port=%d", port)
	if !g.console.WaitFor(listening, 3*time.Minute, g.done) {
		t.Fatalf("Linux not listening; console:\n%s\nlog:\n%s", g.console, g.log)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	if err := g.m.Snapshot(ctx, dir, SnapshotOptions{}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Logf("snapshot of a 256 MiB Linux guest written in %v", time.Since(start).Round(time.Millisecond))

	echoLinux := func(g *vsockGuest, who string) {
		t.Helper()
		c, err := g.connect(port)
		if err != nil {
			t.Fatalf("%s: connect: %v; console:\n%s\nlog:\n%s", who, err, g.console, g.log)
		}
		if err := echo(c, randomBytes(t, 16<<20)); err != nil {
			t.Fatalf("%s: echo: %v; console:\n%s\nlog:\n%s", who, err, g.console, g.log)
		}
		c.Close()
		if !g.console.WaitFor("init: done ok", time.Minute, g.done) {
			t.Fatalf("%s: /init did not finish; console:\n%s\nlog:\n%s", who, g.console, g.log)
		}
		select {
		case <-g.done:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the machine did not end; console:\n%s", who, g.console)
		}
		if g.err != nil || g.res.Kind != ExitPowerOff {
			t.Errorf("%s: ended with %v, %v; want a power-off", who, g.res.Kind, g.err)
		}
	}
	echoLinux(g, "original")
	start = time.Now()
	r := restoreVsockGuest(t, dir, 7)
	r.start()
	t.Logf("restored in %v", time.Since(start).Round(time.Millisecond))
	echoLinux(r, "restored")
	if strings.Contains(r.console.String(), "init: ready") {
		t.Errorf("the restored guest booted again:\n%s", r.console)
	}
}
