package microvm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/snapshot"
)

// TestSnapshotDiff: a machine that tracks dirty pages takes a full
// snapshot, serves an echo (the guest and the vsock device write memory),
// then a diff snapshot and stops. The diff holds far fewer pages than the
// guest has; restored (its base applied first), its memory is the stopped
// original's byte for byte, so no page written by the guest or by a
// device was missed; and the restore serves the next echo and exits as
// the original would have. A diff is refused without tracking, without a
// base, and over a base replaced since.
func TestSnapshotDiff(t *testing.T) {
	g := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=2", vsockTestPort),
		func(c *microvm.Config) { c.TrackDirtyPages = true })
	g.start()
	g.waitListening(vsockTestPort)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dirs := t.TempDir()
	full, diff := filepath.Join(dirs, "full"), filepath.Join(dirs, "diff")
	if err := g.m.Snapshot(ctx, diff+"-early", microvm.SnapshotOptions{Diff: true}); !errors.Is(err, microvm.ErrConfig) {
		t.Errorf("a diff before any snapshot: %v; want ErrConfig", err)
	}
	if err := g.m.Snapshot(ctx, full, microvm.SnapshotOptions{}); err != nil {
		t.Fatalf("full snapshot: %v", err)
	}
	if err := g.m.Snapshot(ctx, full, microvm.SnapshotOptions{Diff: true, Overwrite: true}); !errors.Is(err, microvm.ErrConfig) {
		t.Errorf("a diff over its own base: %v; want ErrConfig", err)
	}
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := echo(c, randomBytes(t, 1<<20)); err != nil {
		t.Fatalf("echo: %v", err)
	}
	c.Close()
	if err := g.m.Snapshot(ctx, diff, microvm.SnapshotOptions{Diff: true, Stop: true}); err != nil {
		t.Fatalf("diff snapshot: %v; console:\n%s\nlog:\n%s", err, g.console, g.log)
	}
	<-g.done
	if g.res.Kind != microvm.ExitSnapshot {
		t.Fatalf("the original ended with %v, want the snapshot's stop", g.res.Kind)
	}
	info, err := microvm.ReadSnapshot(diff)
	if err != nil || info.Base != full {
		t.Fatalf("ReadSnapshot(diff): base %q, %v; want %s", info.Base, err, full)
	}
	fi, err := os.Stat(filepath.Join(diff, "mem0.diff"))
	if err != nil {
		t.Fatal(err)
	}
	size := g.m.Config().MemoryBytes
	if fi.Size() >= int64(size)/4 {
		t.Errorf("the diff of a 64 MiB guest after one 1 MiB echo is %d KiB; want a small part of it", fi.Size()>>10)
	}
	t.Logf("diff snapshot: %d KiB of memory pages and bitmap", fi.Size()>>10)

	// The diff applied onto its base (as Restore maps it, before the
	// restore writes anything of its own: a new VM generation ID, the
	// vsock transport reset event) is the stopped original's memory.
	want := make([]byte, size)
	if err := g.m.ReadMemory(0, want); err != nil {
		t.Fatal(err)
	}
	if got := mapChain(t, full, diff); !bytes.Equal(got, want) {
		n := differingPages(want, got)
		t.Errorf("the diff applied onto its base differs from the original's memory in %d pages: %#x", len(n), n[:min(len(n), 16)])
	}
	r := restoreVsockGuest(t, diff, 6)
	r.start()
	c, err = r.connect(vsockTestPort)
	if err != nil {
		t.Fatalf("restored diff: connect: %v; console:\n%s\nlog:\n%s", err, r.console, r.log)
	}
	if err := echo(c, randomBytes(t, 1<<20)); err != nil {
		t.Fatalf("restored diff: echo: %v", err)
	}
	c.Close()
	r.wait(0, 30*time.Second)

	// The base replaced by another snapshot: the diff no longer applies.
	other := newVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	other.start()
	other.waitListening(vsockTestPort)
	if err := other.m.Snapshot(ctx, full, microvm.SnapshotOptions{Overwrite: true, Stop: true}); err != nil {
		t.Fatal(err)
	}
	// Its own socket given, so that the base, not the host resources, is
	// what the restore refuses.
	switch m, err := microvm.Restore(diff, microvm.Config{Vsock: &microvm.VsockConfig{UDSPath: filepath.Join(dirs, "v.sock")}}); {
	case err == nil:
		m.Close()
		t.Error("a diff restored over a base replaced since")
	case errors.Is(err, microvm.ErrSnapshotHostResource):
		t.Errorf("a diff over a replaced base: %v; want the base refused", err)
	}
	// Without tracking: refused.
	if err := r.m.Snapshot(ctx, filepath.Join(dirs, "x"), microvm.SnapshotOptions{Diff: true}); err == nil {
		t.Error("a diff of a stopped machine: no error")
	}
}

// mapChain maps memory part mem0 of base with diff applied, as a
// restore of diff does.
func mapChain(t *testing.T, base, diff string) []byte {
	t.Helper()
	var chain []*snapshot.Snapshot
	for _, dir := range []string{base, diff} {
		s, err := snapshot.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		chain = append(chain, s)
	}
	mem, err := snapshot.MapMemoryChain("mem0", chain...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snapshot.Unmap(mem) })
	return mem
}

// differingPages lists the addresses of the 4 KiB pages where a and b
// differ.
func differingPages(a, b []byte) []uint64 {
	var out []uint64
	for off := 0; off < len(a); off += 4096 {
		if !bytes.Equal(a[off:off+4096], b[off:off+4096]) {
			out = append(out, uint64(off))
		}
	}
	return out
}
