package snapshot

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fill writes a recognisable, never all-zero pattern into page i of mem,
// varied by seed.
func fill(mem []byte, i int, seed byte) {
	p := mem[i*PageSize : (i+1)*PageSize]
	for j := range p {
		p[j] = byte(i*7+j*13) ^ seed
	}
	p[0] = seed | 1
}

// testMem returns size bytes of memory with the given pages filled.
func testMem(size int, pages ...int) []byte {
	mem := make([]byte, size)
	for _, i := range pages {
		fill(mem, i, 0x5a)
	}
	return mem
}

// cpuState stands in for a vCPU's state: arrays, a slice, the largest
// uint64.
type cpuState struct {
	RIP   uint64
	Regs  [16]uint64
	XSAVE [1024]uint32
	MSRs  []uint64
	Name  string
}

func testState() cpuState {
	s := cpuState{RIP: 1<<64 - 1, MSRs: []uint64{1, 2, 1 << 63}, Name: "vcpu0"}
	for i := range s.Regs {
		s.Regs[i] = uint64(i) << 40
	}
	s.XSAVE[100] = 0xdeadbeef
	return s
}

// The parts of the snapshot writeTest writes.
const (
	testMemSize = 1 << 20
	memName     = "ram"
)

var testPages = []int{0, 1, 2, 100, 255}

// writeTest commits a snapshot at dir with a state part "cpu0", a blob
// "console" and a memory part "ram", and returns its memory.
func writeTest(t testing.TB, dir string) []byte {
	t.Helper()
	mem := testMem(testMemSize, testPages...)
	w, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	must(t, w.SetMetadata("microvm.version", "test"))
	must(t, w.AddState("cpu0", testState()))
	must(t, w.AddFile("console", strings.NewReader("console output\n")))
	must(t, w.AddMemory(memName, mem))
	must(t, w.Commit())
	return mem
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// mustOpen opens dir, closed when the test ends.
func mustOpen(t testing.TB, dir string) *Snapshot {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// editManifest rewrites dir's manifest.json through fn on its generic
// JSON form.
func editManifest(t testing.TB, dir string, fn func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, ManifestFile)
	data, err := os.ReadFile(p)
	must(t, err)
	var m map[string]any
	must(t, json.Unmarshal(data, &m))
	fn(m)
	data, err = json.Marshal(m)
	must(t, err)
	must(t, os.WriteFile(p, data, 0o600))
}

// part returns the generic form of the manifest's part i.
func part(m map[string]any, i int) map[string]any {
	return m["parts"].([]any)[i].(map[string]any)
}

// flipByte inverts the byte at off in path.
func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	must(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, off)
	must(t, err)
}

// holesSupported probes whether dir's file system keeps holes and
// reports them through SEEK_DATA at 4 KiB granularity.
func holesSupported(t testing.TB, dir string) bool {
	t.Helper()
	f, err := os.CreateTemp(dir, "probe")
	must(t, err)
	defer os.Remove(f.Name())
	defer f.Close()
	must(t, f.Truncate(1<<20))
	_, err = f.WriteAt([]byte{1}, 512<<10)
	must(t, err)
	must(t, f.Sync())
	var st syscall.Stat_t
	must(t, syscall.Fstat(int(f.Fd()), &st))
	if st.Blocks*512 >= 1<<20 {
		return false
	}
	off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	return err == nil && off == 512<<10
}

// wantErr fails unless err wraps every one of want.
func wantErr(t testing.TB, err error, want ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", want)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Fatalf("error %q is not %v", err, w)
		}
	}
}
