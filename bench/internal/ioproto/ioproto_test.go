package ioproto

import (
	"strings"
	"testing"
	"time"
)

func TestCmdlineRoundTrip(t *testing.T) {
	for _, p := range []Params{
		{Mode: ModeBlk, Duration: 2 * time.Second, Dev: "/dev/vda"},
		{Mode: ModeBlk, Duration: 1500 * time.Millisecond, Dev: "/dev/vdb"},
		{Mode: ModeNet, Duration: 3 * time.Second, GuestAddr: "10.99.1.2/24", HostAddr: "10.99.1.1",
			Iface: "eth0", SendPort: 5001, RecvPort: 5002},
	} {
		line := "console=ttyS0 reboot=k panic=-1 quiet " + p.Cmdline() + " other.param=1"
		got, err := ParseCmdline(line)
		if err != nil {
			t.Fatalf("ParseCmdline(%q): %v", line, err)
		}
		if got != p {
			t.Errorf("ParseCmdline(%q):\n got %+v\nwant %+v", line, got, p)
		}
	}
}

func TestParseCmdlineErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"quiet", "iobench.mode"},
		{"iobench.mode=disk iobench.seconds=1", "iobench.mode"},
		{"iobench.mode=blk", "iobench.seconds"},
		{"iobench.mode=blk iobench.seconds=0 iobench.dev=/dev/vda", "not above 0"},
		{"iobench.mode=blk iobench.seconds=x iobench.dev=/dev/vda", "iobench.seconds=x"},
		{"iobench.mode=blk iobench.seconds=1", "iobench.dev"},
		{"iobench.mode=net iobench.seconds=1 iobench.guest=10.0.0.2/24", "net needs"},
		{"iobench.mode=net iobench.seconds=1 iobench.send=x", "iobench.send=x"},
		{"iobench.mode=blk iobench.bogus=1", "unknown parameter"},
	} {
		_, err := ParseCmdline(tc.line)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseCmdline(%q) = %v, want an error with %q", tc.line, err, tc.want)
		}
	}
}

func TestResultLine(t *testing.T) {
	r := Result{Test: "seq-read-4k", BlockSize: 4096, Ops: 100, Bytes: 409600, Seconds: 0.5}
	for _, line := range []string{r.Line(), "[    3.1] noise " + r.Line() + "\r"} {
		got, ok, err := ParseResult(line)
		if !ok || err != nil || got != r {
			t.Errorf("ParseResult(%q) = %+v, %v, %v; want %+v", line, got, ok, err, r)
		}
	}
	if _, ok, err := ParseResult("iobench: done ok"); ok || err != nil {
		t.Errorf("ParseResult(done line) = ok %v err %v, want neither", ok, err)
	}
	for _, bad := range []string{ResultPrefix + "{", ResultPrefix + `{"test":"x"}`, ResultPrefix + `{"seconds":1}`} {
		if _, ok, err := ParseResult(bad); !ok || err == nil {
			t.Errorf("ParseResult(%q) = ok %v err %v, want ok and an error", bad, ok, err)
		}
	}
}
