package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchSize is the benchmarks' guest: 256 MiB, every tenth page non-zero.
const benchSize = 256 << 20

// benchMem returns the benchmarks' guest memory with every page faulted
// in, as a running guest's is: the first read of a page never touched
// costs a page fault (some microseconds in a nested VM), which would
// otherwise land in the first iteration alone.
func benchMem() []byte {
	mem := make([]byte, benchSize)
	for i := 0; i < benchSize/PageSize; i++ {
		if i%10 == 0 {
			fill(mem, i, byte(i))
		} else {
			mem[i*PageSize] = 0 // a write: a page of its own, not the zero page
		}
	}
	return mem
}

// BenchmarkAddMemory: saving the guest's memory, fsync included. MB/s is
// of the guest's size; data-MB/s of the non-zero pages written.
func BenchmarkAddMemory(b *testing.B) {
	mem := benchMem()
	parent := b.TempDir()
	b.SetBytes(benchSize)
	var data int64
	for i := 0; b.Loop(); i++ {
		w, err := Create(filepath.Join(parent, fmt.Sprint(i)))
		must(b, err)
		must(b, w.AddMemory(memName, mem))
		data = w.parts[0].DataBytes
		b.StopTimer()
		must(b, w.Abort())
		b.StartTimer()
	}
	b.ReportMetric(float64(data)*float64(b.N)/b.Elapsed().Seconds()/1e6, "data-MB/s")
}

// BenchmarkMapMemory: restoring the guest's memory from a committed
// snapshot (page cache warm). map: MapMemory and Unmap, what a restore
// costs before the guest runs; touch: also reading a byte of every page,
// as a guest reading all its memory would; read: copying the file into
// memory instead of mapping it, for comparison; verify: Verify.
func BenchmarkMapMemory(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "snap")
	w, err := Create(dir)
	must(b, err)
	must(b, w.AddMemory(memName, benchMem()))
	must(b, w.Commit())
	s := mustOpen(b, dir)

	b.Run("map", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			m, err := s.MapMemory(memName)
			must(b, err)
			must(b, Unmap(m))
		}
	})
	b.Run("touch", func(b *testing.B) {
		b.SetBytes(benchSize)
		var sum byte
		for b.Loop() {
			m, err := s.MapMemory(memName)
			must(b, err)
			for i := 0; i < len(m); i += PageSize {
				sum += m[i]
			}
			must(b, Unmap(m))
		}
		_ = sum
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(benchSize)
		buf := make([]byte, benchSize)
		f, err := os.Open(filepath.Join(dir, "ram.mem"))
		must(b, err)
		defer f.Close()
		for b.Loop() {
			_, err := f.ReadAt(buf, 0)
			must(b, err)
		}
	})
	b.Run("verify", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			must(b, s.Verify())
		}
	})
}
