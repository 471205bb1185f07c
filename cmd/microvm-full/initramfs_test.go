package main

import (
	"strings"
	"testing"
)

// TestAddKeepsCommas: --add values are kept whole (a string slice flag
// split them at commas).
func TestAddKeepsCommas(t *testing.T) {
	dir := t.TempDir()
	status, _, stderr := runMain(t, "initramfs", "-o", dir+"/out.cpio", "--agent", dir+"/no-agent", "--add", dir+"/a,b:/x")
	if status == 0 || !strings.Contains(stderr, "no-agent") {
		t.Fatalf("status %d, stderr %q", status, stderr)
	}
	status, _, stderr = runMain(t, "initramfs", "-o", dir+"/out.cpio", "--agent", "/bin/busybox", "--busybox", "", "--add", dir+"/a,b:/x")
	if status == 0 || !strings.Contains(stderr, dir+"/a,b") {
		t.Errorf("--add with a comma: status %d, stderr %q; want the whole path named", status, stderr)
	}
}
