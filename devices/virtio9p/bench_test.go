package virtio9p_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hugelgupf/p9/p9"

	"github.com/microvm/microvm/devices/virtio9p"
)

// BenchmarkShare measures the device and server in-process, a p9 client
// standing in for the guest's: 60 KiB reads and writes of one file (what
// fits the test driver's 64 KiB slots), and a walk plus getattr (a stat of
// a path two names deep), per operation. A guest adds its own kernel's
// cost and the exits of its kicks and interrupts.
func BenchmarkShare(b *testing.B) {
	const chunk = 60 << 10
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "f"), make([]byte, chunk), 0o644); err != nil {
		b.Fatal(err)
	}
	d := newDriver(b, virtio9p.Config{Root: dir})
	c, err := p9.NewClient(d, p9.WithMessageSize(slotSize))
	if err != nil {
		b.Fatal(err)
	}
	root, err := c.Attach("")
	if err != nil {
		b.Fatal(err)
	}
	_, f, err := root.Walk([]string{"a", "f"})
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadWrite); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, chunk)
	b.Run("read-60KiB", func(b *testing.B) {
		b.SetBytes(chunk)
		for b.Loop() {
			if n, err := f.ReadAt(buf, 0); err != nil || n != chunk {
				b.Fatalf("read %d: %v", n, err)
			}
		}
	})
	b.Run("write-60KiB", func(b *testing.B) {
		b.SetBytes(chunk)
		for b.Loop() {
			if n, err := f.WriteAt(buf, 0); err != nil || n != chunk {
				b.Fatalf("write %d: %v", n, err)
			}
		}
	})
	b.Run("walk-getattr", func(b *testing.B) {
		for b.Loop() {
			_, g, err := root.Walk([]string{"a", "f"})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, _, err := g.GetAttr(p9.AttrMaskAll); err != nil {
				b.Fatal(err)
			}
			g.Close()
		}
	})
	f.Close()
	root.Close()
}
