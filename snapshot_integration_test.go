package microvm_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// KVM integration test of snapshots with the bundled test guest: a running
// machine is snapshotted and goes on, and the snapshot restored twice (in
// this process, beside the original) gives two machines that go on from
// the same point with their own vsock sockets and CIDs.

// restoreVsockGuest restores the snapshot in dir as a vsockGuest with its
// own host socket and CID (and the host settings adjust makes). Cleanup
// stops and closes it.
func restoreVsockGuest(t *testing.T, dir string, cid uint64, adjust ...func(*microvm.Config)) *vsockGuest {
	t.Helper()
	g, log := newGuestHost(t)
	host := microvm.Config{Console: g.console, Log: log, Vsock: &microvm.VsockConfig{CID: cid, UDSPath: g.uds}}
	for _, f := range adjust {
		f(&host)
	}
	var err error
	if g.m, err = microvm.Restore(dir, host); err != nil {
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
	if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{Labels: map[string]string{"job": "echo"}}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if info, err := microvm.ReadSnapshot(dir); err != nil || info.Labels["job"] != "echo" || len(info.Labels) != 1 ||
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
		r := restoreVsockGuest(t, dir, cid, func(c *microvm.Config) { c.PrefaultMemory = i == 1 })
		r.start()
		echoOnce(r, fmt.Sprintf("restore %d", i+1))
		if got := r.m.Config().Vsock.CID; got != cid {
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
	g := newVsockGuestConfig(t, "", func(c *microvm.Config) {
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
	if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{}); err != nil {
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
		if g.err != nil || g.res.Kind != microvm.ExitPowerOff {
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

// TestSnapshotNewGenerationID: with ACPI, a booted machine has a VM
// generation ID in guest memory at devices.VMGenIDAddr; each restore of a
// snapshot writes a new one there before it runs and raises the Generic
// Event Device's interrupt once when it starts, so no two clones, nor a
// clone and its original, share an ID. With --acpi=off there is none.
// (TestSnapshotLinuxClonesReseed shows what the guest does with it.)
func TestSnapshotNewGenerationID(t *testing.T) {
	readID := func(g *vsockGuest, who string) [devices.VMGenIDSize]byte {
		t.Helper()
		var id [devices.VMGenIDSize]byte
		if err := g.m.ReadMemory(devices.VMGenIDAddr, id[:]); err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		return id
	}
	g := newVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	g.start()
	g.waitListening(vsockTestPort)
	orig := readID(g, "original")
	if orig == ([devices.VMGenIDSize]byte{}) || orig != microvm.VMGenIDOf(g.m).ID() {
		t.Fatalf("booted machine's generation ID in memory % x, device's % x", orig, microvm.VMGenIDOf(g.m).ID())
	}
	if _, notified := microvm.VMGenIDOf(g.m).Counts(); notified != 0 {
		t.Errorf("a booted machine raised the generation ID's interrupt %d times", notified)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{Stop: true}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	seen := map[[devices.VMGenIDSize]byte]string{orig: "the original"}
	for i, cid := range []uint64{4, 5} {
		who := fmt.Sprintf("restore %d", i+1)
		r := restoreVsockGuest(t, dir, cid)
		id := readID(r, who)
		if prev, ok := seen[id]; ok {
			t.Errorf("%s has the generation ID of %s: % x", who, prev, id)
		}
		seen[id] = who
		gen := microvm.VMGenIDOf(r.m)
		if _, notified := gen.Counts(); notified != 0 {
			t.Errorf("%s raised the interrupt before it ran", who)
		}
		r.start()
		c, err := r.connect(vsockTestPort)
		if err != nil {
			t.Fatalf("%s: connect: %v; console:\n%s", who, err, r.console)
		}
		if err := echo(c, randomBytes(t, 4096)); err != nil {
			t.Fatalf("%s: echo: %v; console:\n%s", who, err, r.console)
		}
		c.Close()
		r.wait(0, 30*time.Second)
		// Run raised it when it started the vCPUs, before the echo.
		if _, notified := gen.Counts(); notified != 1 {
			t.Errorf("%s: the interrupt was raised %d times in its run, want 1", who, notified)
		}
	}

	off := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort),
		func(c *microvm.Config) { c.NoACPI = true })
	if microvm.VMGenIDOf(off.m) != nil {
		t.Error("a machine without ACPI has a VM generation ID")
	}
	if id := readID(off, "--acpi=off"); id != ([devices.VMGenIDSize]byte{}) {
		t.Errorf("a machine without ACPI has % x at the generation ID's address", id)
	}
}

// TestSnapshotLinuxClonesReseed: two clones restored from one snapshot of
// a Linux guest must not share the kernel's random numbers. The guest's
// /init (scenario urandom) waits for cloneUptime of uptime, asks the kernel
// to reseed its RNG, listens, and is snapshotted there; each of two
// restores, with its own CID, gets a new VM generation ID and the Generic
// Event Device's interrupt, on which Linux's vmgenid driver reseeds the
// RNG with the ID ("crng reseeded due to virtual machine fork" on the
// console); then each clone answers one connection with 32 bytes of
// /dev/urandom, read on CPU 0, and powers off. The clones' bytes must
// differ.
//
// Without the interrupt they would be the same: same memory, same key,
// same CPU, as long as the kernel's own reseed (which would mix in each
// clone's interrupt timings) has not come. Linux 6.1 reseeds by itself
// once the key is older than half the uptime (a minute at most): 20 s
// after the reseed at 40 s of uptime. The clones are read a few seconds
// after the snapshot; the test fails if they were read so late that the
// kernel's own reseed could have made the bytes differ. Both irqchip
// models: the interrupt reaches the guest through microvm's IOAPIC
// routes (split) or KVM's IOAPIC (kernel); the two run side by side, as
// each spends most of its time waiting for the uptime.
// cloneUptime is how long TestSnapshotLinuxClonesReseed's guest waits
// after boot before it reseeds and listens.
const cloneUptime = 40 * time.Second

func TestSnapshotLinuxClonesReseed(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	kernel, initrd := testenv.BzImage(t), testenv.Initrd(t)
	for _, chip := range []microvm.IRQChip{microvm.IRQChipSplit, microvm.IRQChipKernel} {
		t.Run(string(chip), func(t *testing.T) {
			t.Parallel()
			const port = 1024
			// timeout=10m: the scenario's clock runs on across the
			// snapshot (a restore moves the guest's clock on).
			cmdline := fmt.Sprintf("%s microvm.scenarios=urandom microvm.urandom.port=%d microvm.urandom.conns=1 microvm.urandom.uptime=%v microvm.timeout=10m",
				linuxCmdline, port, cloneUptime)
			g := newVsockGuestConfig(t, "", func(c *microvm.Config) {
				c.Kernel, c.Initrd, c.Cmdline, c.CPUs, c.MemoryBytes, c.IRQChip = kernel, initrd, cmdline, 2, 128<<20, chip
			})
			g.start()
			listening := fmt.Sprintf("init: scenario urandom listening port=%d", port)
			if !g.console.WaitFor(listening, 6*time.Minute, g.done) {
				t.Fatalf("Linux not listening; console:\n%s\nlog:\n%s", g.console, g.log)
			}
			reseededAt := time.Now() // no earlier than the guest's reseed
			dir := filepath.Join(t.TempDir(), "snap")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{Stop: true}); err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			t.Logf("snapshot taken in %v", time.Since(start).Round(time.Millisecond))

			clones := []*vsockGuest{restoreVsockGuest(t, dir, 7), restoreVsockGuest(t, dir, 8)}
			start = time.Now()
			for _, r := range clones {
				r.start()
			}
			// Wait for both clones' reseed at once, for at most 30 s.
			const reseeded = "random: crng reseeded due to virtual machine fork"
			seen := make([]chan bool, len(clones))
			for i, r := range clones {
				seen[i] = make(chan bool, 1)
				go func() { seen[i] <- r.console.WaitFor(reseeded, 30*time.Second, r.done) }()
			}
			for i, r := range clones {
				if !<-seen[i] {
					// Go on: the bytes show whether the clones differ anyway.
					t.Errorf("clone %d: no %q on the console within 30 s; console:\n%s", i+1, reseeded, r.console)
				}
			}
			t.Logf("both clones reseeded (or gave up) %v after they started", time.Since(start).Round(time.Millisecond))
			var got [][]byte
			for i, r := range clones {
				c, err := r.connect(port)
				if err != nil {
					t.Fatalf("clone %d: connect: %v; console:\n%s\nlog:\n%s", i+1, err, r.console, r.log)
				}
				b, err := io.ReadAll(c)
				c.Close()
				if err != nil || len(b) != 32 {
					t.Fatalf("clone %d: read %d bytes (%v), want 32; console:\n%s", i+1, len(b), err, r.console)
				}
				got = append(got, b)
			}
			t.Logf("clones' /dev/urandom, %v after they started: % x | % x", time.Since(start).Round(time.Millisecond), got[0], got[1])
			// The guest's clock runs no faster than the host's, across
			// the restore too; the listening line was seen after the
			// reseed, so a second of slack covers the guest's side.
			if late := time.Since(reseededAt) + time.Second; late >= cloneUptime/2 {
				t.Errorf("the clones were read %v after the snapshot's reseed, past the kernel's own reseed interval (%v at %v of uptime): differing bytes would not show the generation ID's reseed",
					late.Round(time.Millisecond), cloneUptime/2, cloneUptime)
			}
			if bytes.Equal(got[0], got[1]) {
				t.Errorf("both clones read the same 32 bytes from /dev/urandom: % x", got[0])
			}
			for i, r := range clones {
				if !r.console.WaitFor("init: done ok", time.Minute, r.done) {
					t.Fatalf("clone %d: /init did not finish; console:\n%s", i+1, r.console)
				}
				select {
				case <-r.done:
				case <-time.After(time.Minute):
					t.Fatalf("clone %d: the machine did not end; console:\n%s", i+1, r.console)
				}
				if r.err != nil || r.res.Kind != microvm.ExitPowerOff {
					t.Errorf("clone %d: ended with %v, %v; want a power-off", i+1, r.res.Kind, r.err)
				}
				if strings.Contains(r.console.String(), "init: ready") {
					t.Errorf("clone %d booted again:\n%s", i+1, r.console)
				}
			}
		})
	}
}

// TestSnapshotNewMAC: a machine with a network device (a TAP in a network
// namespace made for the test) is snapshotted; a restore given another
// MAC has its device report it and lists the change (the address the
// guest's driver still uses, and the new one) for the guest's agent; a
// restore given none keeps the snapshot's and lists nothing.
func TestSnapshotNewMAC(t *testing.T) {
	testenv.RequireKVM(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace and its TAPs")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP: %v", err)
	}
	ns := testenv.NewNetNS(t, "mvsnapmac")
	nsPath := "/var/run/netns/" + ns
	macA, _ := net.ParseMAC("02:00:00:00:0a:01")
	macB, _ := net.ParseMAC("02:00:00:00:0b:01")
	g := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort), func(c *microvm.Config) {
		c.Nets = []microvm.NetConfig{{TAP: "snapmac0", NetNS: nsPath, MAC: macA}}
	})
	g.start()
	g.waitListening(vsockTestPort)
	dir := filepath.Join(t.TempDir(), "snap")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.m.Snapshot(ctx, dir, microvm.SnapshotOptions{}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}

	clone := restoreVsockGuest(t, dir, 7, func(h *microvm.Config) {
		h.Nets = []microvm.NetConfig{{TAP: "snapmac1", NetNS: nsPath, MAC: macB}}
	})
	if got := clone.m.NetMAC(0); !bytes.Equal(got, macB) {
		t.Errorf("the clone's device reports MAC %v; want its own %v", got, macB)
	}
	want := []microvm.MACChange{{Net: 0, Old: macA, New: macB}}
	if got := clone.m.MACChanges(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("MACChanges %v; want %v", got, want)
	}
	same := restoreVsockGuest(t, dir, 8, func(h *microvm.Config) {
		h.Nets = []microvm.NetConfig{{TAP: "snapmac2", NetNS: nsPath}}
	})
	if got := same.m.NetMAC(0); !bytes.Equal(got, macA) || same.m.MACChanges() != nil {
		t.Errorf("a restore given no MAC: device MAC %v, changes %v; want the snapshot's %v and none", got, same.m.MACChanges(), macA)
	}
	// The clone runs: it serves its one echo.
	clone.start()
	c, err := clone.connect(vsockTestPort)
	if err != nil {
		t.Fatalf("the clone: connect: %v", err)
	}
	if err := echo(c, randomBytes(t, 1<<20)); err != nil {
		t.Fatalf("the clone: echo: %v", err)
	}
	c.Close()
}
