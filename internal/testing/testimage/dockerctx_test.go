package testimage

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestWriteDockerContext: the four files, the base image's extra lines
// before its WORKDIR, and busybox as this host has it.
func TestWriteDockerContext(t *testing.T) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skipf("no busybox: %v", err)
	}
	dir := t.TempDir()
	if err := WriteDockerContext(dir, "ENV FOO=bar\n"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Dockerfile.base": "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV FOO=bar\nWORKDIR /work\n",
		"Dockerfile.app":  dockerfileApp,
		"hello.txt":       HelloContext,
	}
	if bb, err := os.ReadFile(busybox); err == nil {
		want["busybox"] = string(bb)
	}
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != w {
			t.Errorf("%s: %v; content differs (%d bytes, want %d)", name, err, len(got), len(w))
		}
	}
}
