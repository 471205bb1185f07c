package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// NeedMkfs is Missing where mkfs.ext4 (e2fsprogs, which scripts/deps
// installs) is not there: the tests that make cache disks and Docker's
// data disk need it.
func NeedMkfs(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err == nil {
		return
	}
	if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err == nil {
		return
	}
	Missing(tb, "mkfs.ext4 not installed (e2fsprogs)")
}
