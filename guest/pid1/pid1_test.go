//go:build linux

package pid1

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/microvm/microvm/devices/acpi"
)

// TestHasS5: microvm's own DSDT says it can power off; a DSDT without \_S5
// does not.
func TestHasS5(t *testing.T) {
	m := acpi.Machine{CPUs: 1, SleepControlPort: 0x610, SleepStatusPort: 0x611, ResetPort: 0x612}
	tb, err := acpi.Build(acpi.TablesAddr, m)
	if err != nil {
		t.Fatal(err)
	}
	dsdt := tb.Bytes[tb.Offsets["DSDT"]:]
	if !HasS5(dsdt) {
		t.Error("microvm's DSDT: HasS5 = false")
	}
	if HasS5([]byte("DSDT\x24\x00\x00\x00 no sleep states here")) {
		t.Error("a DSDT without _S5_: HasS5 = true")
	}
}

// TestLinkResolvConf: the link is made when the kernel named a DNS server
// and the root has no resolv.conf, and not otherwise.
func TestLinkResolvConf(t *testing.T) {
	logf := func(format string, args ...any) { t.Logf(format, args...) }
	dir := t.TempDir()
	pnp := filepath.Join(dir, "pnp")
	resolv := filepath.Join(dir, "etc", "resolv.conf")
	if linkResolvConf(pnp, resolv, logf) {
		t.Fatal("linked without a pnp file (no ip= autoconfiguration)")
	}
	os.WriteFile(pnp, []byte("#PROTO: DHCP\n"), 0o644)
	if linkResolvConf(pnp, resolv, logf) {
		t.Fatal("linked though the kernel named no DNS server")
	}
	os.WriteFile(pnp, []byte("#PROTO: DHCP\nnameserver 192.168.127.1\n"), 0o644)
	if !linkResolvConf(pnp, resolv, logf) {
		t.Fatal("no link with a DNS server and no resolv.conf")
	}
	if got, err := os.Readlink(resolv); err != nil || got != pnp {
		t.Fatalf("resolv.conf links to %q (%v), want %q", got, err, pnp)
	}
	if linkResolvConf(pnp, resolv, logf) {
		t.Error("replaced an existing resolv.conf")
	}
}
