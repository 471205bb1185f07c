package snapshot

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRoundTrip: what a Writer commits, Open gives back: the manifest's
// format, version, metadata and parts, each state part decoded equal, the
// blob's bytes, the memory's bytes; Verify finds nothing wrong.
func TestRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	before := time.Now().Add(-time.Second)
	mem := writeTest(t, dir)
	s := mustOpen(t, dir)

	m := s.Manifest()
	if m.Format != FormatName || m.Version != Version || m.Created.Before(before) {
		t.Errorf("manifest %q version %d created %v", m.Format, m.Version, m.Created)
	}
	if got := m.Metadata["microvm.version"]; got != "test" {
		t.Errorf("metadata microvm.version = %q, want test", got)
	}
	var kinds []string
	for _, p := range m.Parts {
		kinds = append(kinds, p.Name+":"+p.File+":"+string(p.Kind))
	}
	if want := []string{"cpu0:cpu0.json:state", "console:console.bin:blob", "ram:ram.mem:memory"}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("parts (-want +got):\n-%q\n+%q", want, kinds)
	}
	if p, _ := s.Part(memName); p.DataBytes != 5*PageSize || p.MemorySize != testMemSize {
		t.Errorf("memory part %+v: want 5 pages of data of %d", p, testMemSize)
	}
	if len(s.Digest()) != 64 {
		t.Errorf("digest %q", s.Digest())
	}

	var st cpuState
	must(t, s.State("cpu0", &st))
	if want := testState(); !reflect.DeepEqual(st, want) {
		t.Errorf("state (-want +got):\n-%+v\n+%+v", want, st)
	}
	r, err := s.File("console")
	must(t, err)
	b, err := io.ReadAll(r)
	must(t, err)
	if string(b) != "console output\n" {
		t.Errorf("blob %q", b)
	}
	got, err := s.MapMemory(memName)
	must(t, err)
	defer Unmap(got)
	if !bytes.Equal(got, mem) {
		t.Error("mapped memory differs from what was saved")
	}
	if err := s.Verify(); err != nil {
		t.Errorf("Verify: %v", err)
	}

	// A part of another kind, or none, is ErrNoPart.
	if err := s.State(memName, &st); !errors.Is(err, ErrNoPart) {
		t.Errorf("State of a memory part: %v", err)
	}
	if _, err := s.MapMemory("nope"); !errors.Is(err, ErrNoPart) {
		t.Errorf("MapMemory of no part: %v", err)
	}
}

// TestStateFieldsAddedRemoved: a state written by an older or newer
// version of its struct decodes: unknown fields are ignored, missing ones
// left zero.
func TestStateFieldsAddedRemoved(t *testing.T) {
	type v1 struct{ A, B int }
	type v2 struct {
		A     int
		C     string
		Extra []uint32
	}
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := Create(dir)
	must(t, err)
	must(t, w.AddState("old", v1{A: 1, B: 2}))
	must(t, w.AddState("new", v2{A: 3, C: "c", Extra: []uint32{4}}))
	must(t, w.Commit())
	s := mustOpen(t, dir)
	var n v2
	must(t, s.State("old", &n))
	if want := (v2{A: 1}); !reflect.DeepEqual(n, want) {
		t.Errorf("v1 read as v2: %+v, want %+v", n, want)
	}
	var o v1
	must(t, s.State("new", &o))
	if want := (v1{A: 3}); o != want {
		t.Errorf("v2 read as v1: %+v, want %+v", o, want)
	}
}

// TestBlobCorrupt: a blob's reader returns ErrCorrupt, not io.EOF, at the
// end of bytes that do not match; Open does not read blobs.
func TestBlobCorrupt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeTest(t, dir)
	flipByte(t, filepath.Join(dir, "console.bin"), 3)
	s := mustOpen(t, dir)
	r, err := s.File("console")
	must(t, err)
	_, err = io.ReadAll(r)
	wantErr(t, err, ErrCorrupt)
	wantErr(t, s.Verify(), ErrCorrupt)
}

// TestOpenRefuses: each way a snapshot can be damaged, or forged, is
// refused by Open with the sentinel error for it and a message naming the
// part's file where one is at fault.
func TestOpenRefuses(t *testing.T) {
	ram := func(dir string) string { return filepath.Join(dir, "ram.mem") }
	cpu := func(dir string) string { return filepath.Join(dir, "cpu0.json") }
	setPart := func(i int, key string, v any) func(*testing.T, string) {
		return func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { part(m, i)[key] = v })
		}
	}
	set := func(key string, v any) func(*testing.T, string) {
		return func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m[key] = v })
		}
	}
	writeManifest := func(s string) func(*testing.T, string) {
		return func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, ManifestFile), []byte(s), 0o600))
		}
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []error
		names  string // in the message
	}{
		{"truncated memory", func(t *testing.T, dir string) { must(t, os.Truncate(ram(dir), testMemSize-PageSize)) },
			[]error{ErrTruncated}, "ram.mem"},
		{"truncated state", func(t *testing.T, dir string) { must(t, os.Truncate(cpu(dir), 10)) },
			[]error{ErrTruncated}, "cpu0.json"},
		{"state longer", func(t *testing.T, dir string) {
			f, err := os.OpenFile(cpu(dir), os.O_APPEND|os.O_WRONLY, 0)
			must(t, err)
			f.Write([]byte(" "))
			f.Close()
		}, []error{ErrCorrupt}, "cpu0.json"},
		{"state byte flipped", func(t *testing.T, dir string) { flipByte(t, cpu(dir), 20) },
			[]error{ErrCorrupt}, "cpu0.json"},
		{"missing part file", func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, "console.bin"))) },
			[]error{ErrTruncated, fs.ErrNotExist}, "console.bin"},
		{"part is a FIFO", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "console.bin")
			must(t, os.Remove(p))
			must(t, syscall.Mkfifo(p, 0o600))
		}, []error{ErrFormat}, "console.bin"},
		{"newer version", set("version", 2), []error{ErrNewerVersion}, "version 2"},
		{"much newer version", writeManifest(`{"format":"microvm-snapshot","version":123456789012345678901234567890}`),
			[]error{ErrNewerVersion}, ""},
		{"newer version of another shape", writeManifest(`{"format":"microvm-snapshot","version":7,"parts":"elsewhere"}`),
			[]error{ErrNewerVersion}, ""},
		{"version 0", set("version", 0), []error{ErrFormat}, ""},
		{"version a string", set("version", "one"), []error{ErrFormat}, ""},
		{"wrong format", set("format", "firecracker"), []error{ErrFormat}, "firecracker"},
		{"no manifest", func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, ManifestFile))) },
			[]error{ErrFormat, fs.ErrNotExist}, ManifestFile},
		{"manifest cut short", func(t *testing.T, dir string) { must(t, os.Truncate(filepath.Join(dir, ManifestFile), 100)) },
			[]error{ErrFormat}, ""},
		{"manifest too large", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				m["padding"] = strings.Repeat("x", MaxManifestSize)
			})
		}, []error{ErrFormat}, "bytes"},
		{"part name with ../", setPart(0, "name", "../cpu0"), []error{ErrFormat}, ""},
		{"part name with ..", setPart(0, "name", "a..b"), []error{ErrFormat}, ""},
		{"file with ../", setPart(0, "file", "../cpu0.json"), []error{ErrFormat}, ""},
		{"file absolute", setPart(0, "file", "/etc/passwd"), []error{ErrFormat}, ""},
		{"file in a subdirectory", setPart(0, "file", "sub/cpu0.json"), []error{ErrFormat}, ""},
		{"file hidden", setPart(0, "file", ".cpu0.json"), []error{ErrFormat}, ""},
		{"file is the manifest", setPart(0, "file", "MANIFEST.json"), []error{ErrFormat}, ""},
		{"two parts one file", setPart(1, "file", "cpu0.json"), []error{ErrFormat}, "two parts"},
		{"two parts one name", setPart(1, "name", "cpu0"), []error{ErrFormat}, "twice"},
		{"unknown kind", setPart(0, "kind", "compressed"), []error{ErrFormat}, "compressed"},
		{"negative size", setPart(1, "size", -1), []error{ErrFormat}, ""},
		{"absurd state size", setPart(0, "size", 1<<40), []error{ErrFormat}, ""},
		{"absurd memory size", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				part(m, 2)["size"] = float64(1 << 50)
				part(m, 2)["memory_size"] = float64(1 << 50)
			})
		}, []error{ErrFormat}, ""},
		{"memory not whole pages", setPart(2, "size", testMemSize-1), []error{ErrFormat}, ""},
		{"bad checksum syntax", setPart(0, "sha256", "abc"), []error{ErrFormat}, ""},
		{"too many parts", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				parts := m["parts"].([]any)
				for len(parts) <= MaxParts {
					parts = append(parts, parts[0])
				}
				m["parts"] = parts
			})
		}, []error{ErrFormat}, "parts"},
		{"too much metadata", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				m["metadata"] = map[string]any{"k": strings.Repeat("v", maxMetaValue+1)}
			})
		}, []error{ErrFormat}, "metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			writeTest(t, dir)
			tt.damage(t, dir)
			s, err := Open(dir)
			if err == nil {
				s.Close()
			}
			wantErr(t, err, tt.want...)
			t.Log(err)
			if !strings.Contains(err.Error(), tt.names) || !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name %q in %s", err, tt.names, dir)
			}
		})
	}
}

// TestOpenSymlinkOutside: a part's file that is a symbolic link leading
// out of the directory is never opened.
func TestOpenSymlinkOutside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeTest(t, dir)
	p := filepath.Join(dir, "console.bin")
	must(t, os.Remove(p))
	must(t, os.Symlink("/etc/hostname", p))
	if s, err := Open(dir); err == nil {
		s.Close()
		t.Fatal("Open followed a symlink out of the snapshot")
	}
}

// TestVerifyMemory: a byte changed in memory, in a data page or in a hole,
// passes Open (which does not read memory) and fails Verify, which names
// the file.
func TestVerifyMemory(t *testing.T) {
	for _, off := range []int64{100*PageSize + 7, 50 * PageSize} {
		dir := filepath.Join(t.TempDir(), "snap")
		writeTest(t, dir)
		flipByte(t, filepath.Join(dir, "ram.mem"), off)
		s := mustOpen(t, dir)
		err := s.Verify()
		wantErr(t, err, ErrCorrupt)
		if !strings.Contains(err.Error(), "ram.mem") {
			t.Errorf("Verify error %q does not name ram.mem", err)
		}
	}
}

// TestVerifyReportsAll: Verify names every part at fault, not the first.
func TestVerifyReportsAll(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeTest(t, dir)
	s := mustOpen(t, dir)
	flipByte(t, filepath.Join(dir, "ram.mem"), 0)
	flipByte(t, filepath.Join(dir, "console.bin"), 0)
	must(t, os.Truncate(filepath.Join(dir, "cpu0.json"), 1))
	err := s.Verify()
	wantErr(t, err, ErrCorrupt, ErrTruncated)
	for _, f := range []string{"ram.mem", "console.bin", "cpu0.json"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("Verify error %q does not name %s", err, f)
		}
	}
}
