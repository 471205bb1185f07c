package agentimage

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

func TestParseAdd(t *testing.T) {
	f, err := ParseAdd("/a:b/c:/guest/x")
	if err != nil || f.Src != "/a:b/c" || f.Dst != "/guest/x" {
		t.Errorf("ParseAdd = %+v, %v", f, err)
	}
	for _, bad := range []string{"", "nocolon", ":/x", "/src:", "/src:relative"} {
		if _, err := ParseAdd(bad); err == nil {
			t.Errorf("ParseAdd(%q) accepted", bad)
		}
	}
}

// fakeStatic is a static x86-64 ELF executable (it only exits): readStatic
// takes it. fakeDynamic is the same with its program header turned into a
// PT_INTERP: a program that needs a dynamic loader.
var (
	fakeStatic  = testenv.TinyELF(testenv.Program{}.Exit(0))
	fakeDynamic = func() []byte {
		b := append([]byte(nil), fakeStatic...)
		b[64] = 3 // the first program header's p_type: PT_INTERP
		return b
	}()
)

// TestBuild writes an image and lists it with cpio: /init is the agent,
// added files and directories keep their bits and get their parents, and
// the dynamic-loader check refuses a dynamic agent.
func TestBuild(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, fakeStatic, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(data, []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "sub", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	err := Build(&buf, Options{Agent: agent, Files: []File{
		{Src: data, Dst: "/deep/er/data"}, {Src: tree, Dst: "/srv/tree"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skipf("no cpio to list the archive: %v", err)
	}
	cmd := exec.Command(cpio, "-itv")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	list := string(out)
	for _, want := range []string{" init\n", " dev/console\n", " deep/er/data\n", " srv/tree/sub/f\n", "-rw-r-----", "-rw-------"} {
		if !strings.Contains(list, want) {
			t.Errorf("archive lacks %q:\n%s", want, list)
		}
	}

	dyn := filepath.Join(dir, "dyn")
	if err := os.WriteFile(dyn, fakeDynamic, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Build(&bytes.Buffer{}, Options{Agent: dyn}); !errors.Is(err, ErrNotStatic) {
		t.Errorf("dynamic agent: %v, want ErrNotStatic", err)
	}
	if err := Build(&bytes.Buffer{}, Options{Agent: agent, Files: []File{{Src: data, Dst: "/init"}}}); err == nil {
		t.Error("an added file replaced /init")
	}
}

// TestBusybox: with Debian's busybox-static, sh and the core utilities are
// links to /bin/busybox.
func TestBusybox(t *testing.T) {
	const bb = "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skipf("no %s: %v", bb, err)
	}
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, fakeStatic, 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Build(&buf, Options{Agent: agent, Busybox: bb}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-itv")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("cpio: %v", err)
	}
	for _, want := range []string{"bin/sh -> /bin/busybox", "bin/cat -> /bin/busybox", " bin/busybox\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("archive lacks %q", want)
		}
	}
}
