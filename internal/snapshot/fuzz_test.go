package snapshot

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen feeds Open arbitrary manifests over a directory holding real
// part files of every kind (a state, a blob, a memory, a memory diff
// against a fixed base): Open must never panic, and whatever it accepts
// must be readable through every accessor, Verify and MapMemoryChain
// without panicking. Seeds: the directory's own manifest (added here) and
// testdata/fuzz/FuzzOpen.
func FuzzOpen(f *testing.F) {
	parent := f.TempDir()
	mem := writeTest(f, filepath.Join(parent, "base"))
	base := mustOpen(f, filepath.Join(parent, "base"))
	fill(mem, 7, 1)
	dirty := make([]uint64, testMemSize/PageSize/64)
	markDirty(dirty, 7)
	dir := filepath.Join(parent, "snap")
	w, err := Create(dir)
	must(f, err)
	must(f, w.SetMetadata("guest.memory", "1M"))
	must(f, w.AddState("cpu0", testState()))
	must(f, w.AddFile("console", io.LimitReader(zeros{}, 100)))
	must(f, w.AddMemory("mem2", mem))
	must(f, w.AddMemoryDiff(memName, base.Digest(), mem, dirty))
	must(f, w.Commit())
	manifest := filepath.Join(dir, ManifestFile)
	seed, err := os.ReadFile(manifest)
	must(f, err)
	f.Add(seed)
	baseManifest, err := os.ReadFile(filepath.Join(parent, "base", ManifestFile))
	must(f, err)
	f.Add(baseManifest)

	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(manifest, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir)
		if err != nil {
			return
		}
		defer s.Close()
		for _, p := range s.Manifest().Parts {
			switch p.Kind {
			case KindState:
				var v any
				_ = s.State(p.Name, &v)
			case KindBlob:
				if r, err := s.File(p.Name); err == nil {
					_, _ = io.Copy(io.Discard, r)
				}
			case KindMemory:
				if m, err := s.MapMemory(p.Name); err == nil {
					_ = m[len(m)-1]
					Unmap(m)
				}
			case KindMemoryDiff:
				if m, err := MapMemoryChain(p.Name, base, s); err == nil {
					Unmap(m)
				}
			}
		}
		_ = s.Verify()
	})
}
