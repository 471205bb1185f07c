package main

import (
	"bufio"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
	"google.golang.org/protobuf/encoding/protowire"
)

// checkProfile: path is a CPU profile as go tool pprof reads it: gzipped
// profile.proto whose default (last) sample type is cpu/nanoseconds, which
// pprof prints as "Type: cpu". Read here with protowire rather than by
// running go tool pprof, which took about 15 s in the nested-KVM box.
func checkProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("profile %s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("profile %s: %v", path, err)
	}
	var strs []string
	var types [][2]uint64 // sample_type: string indexes of type and unit
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("profile %s: %v", path, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || num != 1 && num != 6 {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				t.Fatalf("profile %s: field %d: %v", path, num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			t.Fatalf("profile %s: field %d: %v", path, num, protowire.ParseError(n))
		}
		b = b[n:]
		if num == 6 { // string_table
			strs = append(strs, string(v))
			continue
		}
		var vt [2]uint64 // ValueType: type = 1, unit = 2
		for len(v) > 0 {
			vnum, vtyp, m := protowire.ConsumeTag(v)
			if m < 0 || vtyp != protowire.VarintType {
				t.Fatalf("profile %s: a sample type that is not two varints", path)
			}
			x, k := protowire.ConsumeVarint(v[m:])
			if k < 0 {
				t.Fatalf("profile %s: %v", path, protowire.ParseError(k))
			}
			if vnum == 1 || vnum == 2 {
				vt[vnum-1] = x
			}
			v = v[m+k:]
		}
		types = append(types, vt)
	}
	str := func(i uint64) string {
		if i < uint64(len(strs)) {
			return strs[i]
		}
		return fmt.Sprintf("<string %d of %d>", i, len(strs))
	}
	if len(types) == 0 {
		t.Fatalf("profile %s has no sample type", path)
	}
	if last := types[len(types)-1]; str(last[0]) != "cpu" || str(last[1]) != "nanoseconds" {
		t.Errorf("profile %s: type %s/%s, want cpu/nanoseconds", path, str(last[0]), str(last[1]))
	}
}

// TestCPUProfile: --cpuprofile writes a profile pprof reads, with the
// seccomp filter on (the profiler's per-thread timers are set as threads
// run, after the filter: seccomp.Policy.WithCPUProfiling), while the test
// guest echoes 4 MiB through vsock.
func TestCPUProfile(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	dir := t.TempDir()
	uds, prof := filepath.Join(dir, "v.sock"), filepath.Join(dir, "cpu.prof")
	c := startCLI(t, "--kernel", guest, "--memory", "64M", "--cpus", "2", "--vsock-cid", "3", "--vsock-uds", uds,
		"--cmdline", "testguest.mode=echo testguest.port=1234 testguest.conns=1", "--cpuprofile", prof)
	c.waitLine(t, "testguest: listening 1234", 30*time.Second)
	if mode, err := seccompMode(c.cmd.Process.Pid); err != nil || mode != "2" {
		t.Errorf("Seccomp %q, %v; want the filter on every thread", mode, err)
	}
	payload := make([]byte, 4<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	echoThrough(t, c, uds, 1234, payload)
	if s := c.waitExit(t, 30*time.Second); s != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
	}
	checkProfile(t, prof)

	// A profile file that cannot be made is a usage error, before the VM.
	wantError(t, 2, []string{"run", "--kernel", guest, "--cpuprofile", filepath.Join(dir, "no", "such", "dir", "p")}, "--cpuprofile")
}

// TestCPUProfileVhostUser: vhost-user-vsock --cpuprofile, filter on, writes
// its profile when SIGTERM stops it.
func TestCPUProfileVhostUser(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.prof")
	cmd := exec.Command(exe, "vhost-user-vsock", "--socket", filepath.Join(dir, "vhu.sock"),
		"--uds-path", filepath.Join(dir, "v.sock"), "--cpuprofile", prof)
	cmd.Env = append(os.Environ(), envAsCLI+"=1", "GORACE=atexit_sleep_ms=50")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "vhost-user-vsock listening on") {
		_ = cmd.Process.Kill()
		t.Fatalf("first line %q, %v", line, err)
	}
	if mode, err := seccompMode(cmd.Process.Pid); err != nil || mode != "2" {
		t.Errorf("Seccomp %q, %v; want the filter on every thread", mode, err)
	}
	time.Sleep(100 * time.Millisecond) // threads run with the profiler on
	_ = cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v; stderr:\n%s", err, rest)
	}
	checkProfile(t, prof)
}
