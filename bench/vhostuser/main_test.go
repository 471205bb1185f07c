package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/bench/internal/vhufront"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestMain lets the test binary be the generator's peer process: run
// starts os.Executable with envServePeer set.
func TestMain(m *testing.M) {
	if os.Getenv(envServePeer) == "1" {
		if err := vhufront.ServePeer(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestQuickRun runs the generator for a few seconds against bin/microvm,
// every option set, with bin/microvm standing in for the optional peer
// (-peer, -peer-cmd), and checks every row of device.json and every sample
// of device-runs.json: bytes moved, byte counts that agreed (the generator
// fails the run otherwise), kicks, interrupts and CPU time counted, and
// the AF_UNIX reference measured.
func TestQuickRun(t *testing.T) {
	microvm := testenv.Binary(t)
	dir := t.TempDir()
	rowsPath, runsPath := filepath.Join(dir, "device.json"), filepath.Join(dir, "runs.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-quick", "-microvm", microvm, "-options", strings.Join(allOptions, ","),
		"-payloads", "64,65536", "-peer", microvm,
		"-peer-cmd", "{bin} vhost-user-vsock --socket {socket} --guest-cid {cid} --uds-path {uds}",
		"-json", rowsPath, "-runs-json", runsPath, "-dgram-payloads", "", "-wide-buf-alloc", "1048576"}
	if status := run(args, &stdout, &stderr); status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", status, &stdout, &stderr)
	}
	t.Logf("table:\n%s", &stdout)
	_, parties, _ := strings.Cut(stdout.String(), "what each party paid")
	refLines := 0
	for _, l := range strings.Split(parties, "\n") {
		if f := strings.Fields(l); len(f) == 15 && f[0] == "af_unix" && f[6] != "-" && f[9] == "-" && f[12] != "-" {
			refLines++
		}
	}
	if refLines != 4 { // 2 directions x 2 payloads
		t.Errorf("%d AF_UNIX lines in the per-party table, want 4", refLines)
	}
	var rows []map[string]any
	readJSON(t, rowsPath, &rows)
	fields := []string{"backend", "options", "direction", "payload", "bytes_per_s", "msgs_per_s", "rtt_p50_ns",
		"rtt_p99_ns", "kicks_per_mib", "irqs_per_mib", "backend_cpu_s_per_mib", "af_unix_bytes_per_s",
		"tx_busy_kicks_per_mib", "backend_syscalls_per_mib", "backend_switches_per_mib",
		"host_cpu_s_per_mib", "host_syscalls_per_mib", "host_switches_per_mib",
		"guest_cpu_s_per_mib", "guest_syscalls_per_mib", "guest_switches_per_mib"}
	// Every option set and the peer, and both again with the wide window
	// (all-on only), 2 directions, 2 payloads, stream and ping-pong.
	if want := (len(allOptions) + 1 + 2) * 2 * 2 * 2; len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	seen := map[string]bool{}
	var cpu float64
	for _, r := range rows {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		if diff := cmp.Diff(sorted(fields), sorted(keys)); diff != "" {
			t.Fatalf("row fields (-want +got):\n%s", diff)
		}
		num := func(k string) float64 { return r[k].(float64) }
		id := fmt.Sprintf("%v %v %v %v", r["backend"], r["options"], r["direction"], r["payload"])
		payload := num("payload")
		if num("rtt_p50_ns") == 0 { // a stream row
			id += " tput"
			if num("bytes_per_s") <= 0 || num("af_unix_bytes_per_s") <= 0 || num("kicks_per_mib") <= 0 {
				t.Errorf("%s: %v", id, r)
			}
			if got := num("msgs_per_s") * payload; math.Abs(got-num("bytes_per_s")) > 1e-6*num("bytes_per_s") {
				t.Errorf("%s: msgs/s * payload = %v, bytes/s %v", id, got, num("bytes_per_s"))
			}
		} else {
			id += " rtt"
			if num("rtt_p99_ns") < num("rtt_p50_ns") || num("bytes_per_s") != 0 || num("af_unix_bytes_per_s") != 0 {
				t.Errorf("%s: %v", id, r)
			}
		}
		if num("irqs_per_mib") <= 0 {
			t.Errorf("%s: no interrupts in event mode: %v", id, r)
		}
		// A back-end moves data with syscalls: none counted is a broken
		// reading of /proc/PID/io.
		if num("backend_syscalls_per_mib") <= 0 {
			t.Errorf("%s: no back-end syscalls: %v", id, r)
		}
		// The host and the guest driver move data with syscalls too.
		if num("host_syscalls_per_mib") <= 0 || num("guest_syscalls_per_mib") <= 0 {
			t.Errorf("%s: no host or guest syscalls: %v", id, r)
		}
		cpu += num("backend_cpu_s_per_mib")
		if seen[id] {
			t.Errorf("%s: twice", id)
		}
		seen[id] = true
	}
	for _, b := range []string{"microvm", "peer"} {
		if !seen[b+" all-on win=1M h2g 65536 tput"] {
			t.Errorf("no wide-window row for %s", b)
		}
	}
	if cpu <= 0 {
		t.Error("no back-end CPU time in any row")
	}
	var rep report
	readJSON(t, runsPath, &rep)
	// Samples: every option set, the peer, the two wide-window targets
	// and AF_UNIX.
	if len(rep.Failures) > 0 || len(rep.Samples) != (len(allOptions)+2+2)*2*2*2 {
		t.Errorf("%d samples, failures %q", len(rep.Samples), rep.Failures)
	}
	for _, s := range rep.Samples {
		if s.Kind == kindTput && (s.Bytes <= 0 || s.Msgs <= 0) {
			t.Errorf("sample %+v moved nothing", s)
		}
		if s.Backend != "af_unix" && s.RingBytes == 0 {
			t.Errorf("sample %+v: no bytes through the rings", s)
		}
		if s.CreditRequests != 0 {
			t.Errorf("sample %+v: the guest had to ask for credit", s)
		}
	}
	if !strings.Contains(stdout.String(), "all-on/all-off") {
		t.Errorf("no ratios in the table:\n%s", &stdout)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestUsage: mistakes on the command line exit 2 with one line.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-options", "all-on,turbo"}, `unknown set "turbo"`},
		{[]string{"-payloads", "0"}, `"0" is not a size of 1..65536 bytes`},
		{[]string{"-payloads", "65537"}, `"65537" is not a size`},
		{[]string{"-directions", "up"}, `-directions: "up"`},
		{[]string{"-mode", "spin"}, `-mode "spin"`},
		{[]string{"-queue-size", "100"}, "-queue-size 100"},
		{[]string{"-pairs", "0"}, "nothing to measure"},
		{[]string{"-microvm", "/nonexistent/microvm"}, `microvm back-end "/nonexistent/microvm"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var stdout, stderr bytes.Buffer
		if status := run(tc.args, &stdout, &stderr); status != 2 {
			t.Errorf("%v: exit status %d, want 2", tc.args, status)
		}
		if s := stderr.String(); !strings.Contains(s, tc.want) || strings.Count(s, "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line with %q", tc.args, s, tc.want)
		}
	}
}

func TestCPUTicks(t *testing.T) {
	line := func(comm string) string {
		f := []string{"42", "(" + comm + ")", "S"}
		for n := 4; n <= 52; n++ {
			f = append(f, fmt.Sprint(n*10))
		}
		return strings.Join(f, " ") + "\n"
	}
	for _, comm := range []string{"microvm", "a) b (c", "vhost-device-vs"} {
		got, err := cpuTicks(line(comm))
		if err != nil || got != 140+150 {
			t.Errorf("%q: %d, %v; want 290", comm, got, err)
		}
	}
	for _, bad := range []string{"", "42 microvm S 1 2", "42 (x) S 1 2 3 4 5 6 7 8 9 10 11"} {
		if _, err := cpuTicks(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := processCPU(os.Getpid()); err != nil {
		t.Errorf("our own CPU time: %v", err)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	v := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		p    float64
		want int64
	}{{50, 5}, {99, 10}, {100, 10}, {0, 1}, {10, 1}, {11, 2}} {
		if got := percentile(v, tc.p); got != tc.want {
			t.Errorf("p%v = %d, want %d", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("percentile of nothing")
	}
	if m := median([]float64{3, 1, 2, 9}); m != 2 {
		t.Errorf("median of 4 = %v, want the lower middle 2", m)
	}
	if m := median([]float64{5, 1, 9}); m != 5 {
		t.Errorf("median of 3 = %v", m)
	}
}

// TestAggregate: medians per cell, the AF_UNIX reference joined to the
// stream rows, spread kept, order by target then cell.
func TestAggregate(t *testing.T) {
	cells := []cell{{h2g, kindTput, 64}, {h2g, kindRTT, 64}}
	order := []target{{backend: "microvm", options: "all-on"}, {backend: "af_unix", options: "-"}}
	var ss []sample
	for i, bps := range []float64{300, 100, 200} {
		ss = append(ss,
			sample{Backend: "microvm", Options: "all-on", Dir: h2g, Payload: 64, Kind: kindTput, Pair: i, BytesPerS: bps, MsgsPerS: bps / 64, KicksPerMiB: bps / 10},
			sample{Backend: "microvm", Options: "all-on", Dir: h2g, Payload: 64, Kind: kindRTT, Pair: i, RTTP50: int64(bps), RTTP99: int64(2 * bps)},
			sample{Backend: "af_unix", Options: "-", Dir: h2g, Payload: 64, Kind: kindTput, Pair: i, BytesPerS: 10 * bps},
			sample{Backend: "af_unix", Options: "-", Dir: h2g, Payload: 64, Kind: kindRTT, Pair: i, RTTP50: int64(bps / 10)},
		)
	}
	got := aggregate(ss, order, cells)
	want := []aggRow{
		{row: row{Backend: "microvm", Options: "all-on", Direction: h2g, Payload: 64, BytesPerS: 200, MsgsPerS: 200.0 / 64,
			KicksPerMiB: 20, AFUnixBytesPerS: 2000}, kind: kindTput, n: 3, minVal: 100, maxVal: 300},
		{row: row{Backend: "microvm", Options: "all-on", Direction: h2g, Payload: 64, RTTP50: 200, RTTP99: 400},
			kind: kindRTT, n: 3, minVal: 100, maxVal: 300, afUnixP50: 20},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(aggRow{})); diff != "" {
		t.Errorf("aggregate (-want +got):\n%s", diff)
	}
}

// TestOptionSets: each set differs from all-on in exactly the switch it
// names.
func TestOptionSets(t *testing.T) {
	sets := optionSets()
	if len(sets) != len(allOptions) {
		t.Fatalf("%d sets for %d names", len(sets), len(allOptions))
	}
	on := strings.Split(sets["all-on"], ",")
	for name, key := range map[string]string{"no-direct-enqueue": "direct-enqueue", "no-batch": "batch",
		"no-kick-suppress": "kick-suppress", "no-short-read": "short-read", "no-sndbuf": "sndbuf", "no-ready-gate": "ready-gate"} {
		s := strings.Split(sets[name], ",")
		for i := range on {
			k, _, _ := strings.Cut(on[i], "=")
			if (s[i] != on[i]) != (k == key) || (k == key && !strings.HasSuffix(s[i], "=off")) {
				t.Errorf("%s = %q against all-on %q", name, sets[name], sets["all-on"])
			}
		}
	}
	if sets["all-off"] != "kick-suppress=off,direct-enqueue=off,batch=off,short-read=off,sndbuf=off,ready-gate=off,irq-coalesce=off" ||
		sets["all-on"] != "kick-suppress=on,direct-enqueue=on,batch=on,short-read=on,sndbuf=on,ready-gate=on,irq-coalesce=on" {
		t.Errorf("all-off %q, all-on %q", sets["all-off"], sets["all-on"])
	}
}

func TestExpand(t *testing.T) {
	got := expand([]string{"{bin}", "--socket", "{socket}", "--x={cid}:{cid}"}, map[string]string{"bin": "/b", "socket": "/s", "cid": "3"})
	if diff := cmp.Diff([]string{"/b", "--socket", "/s", "--x=3:3"}, got); diff != "" {
		t.Error(diff)
	}
}

// TestBackendStartErrors: a back-end that exits or never listens is an
// error within the timeout, with its output.
func TestBackendStartErrors(t *testing.T) {
	_, err := startBackend([]string{"sh", "-c", "echo no such flag >&2; exit 3"}, "", "", 3, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited before listening") || !strings.Contains(err.Error(), "no such flag") {
		t.Errorf("exiting back-end: %v", err)
	}
	start := time.Now()
	_, err = startBackend([]string{"sleep", "30"}, "", "", 3, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not create") || time.Since(start) > 10*time.Second {
		t.Errorf("silent back-end: %v after %v", err, time.Since(start))
	}
	// The template's words are expanded: {socket} reaches the command.
	b, err := startBackend([]string{"sh", "-c", `python3 -c "import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); time.sleep(30)" {socket}`}, "", "", 3, 5*time.Second)
	if err != nil {
		t.Skipf("no python3 to play a listening back-end: %v", err)
	}
	if err := b.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// TestFailedBackendFailsTheRun: a back-end that cannot start is reported
// and the run exits 1; the AF_UNIX reference still runs.
func TestFailedBackendFailsTheRun(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	status := run([]string{"-quick", "-options", "all-on", "-payloads", "64", "-directions", "h2g",
		"-microvm", "/bin/sh", "-backend-cmd", "{bin} -c exit", "-timeout", "2s", "-dgram-payloads", "",
		"-json", filepath.Join(dir, "d.json"), "-runs-json", filepath.Join(dir, "r.json")}, &stdout, &stderr)
	if status != 1 || !strings.Contains(stderr.String(), "FAILED pair 0 microvm all-on: back-end") {
		t.Errorf("exit status %d, stderr:\n%s", status, &stderr)
	}
	var rep report
	readJSON(t, filepath.Join(dir, "r.json"), &rep)
	if len(rep.Failures) != 1 || len(rep.Samples) != 2 || rep.Samples[0].Backend != "af_unix" {
		t.Errorf("failures %q, samples %+v", rep.Failures, rep.Samples)
	}
}

// TestQuickDgramRun: the datagram rows, on and off: with datagrams on each
// direction and payload delivers datagrams (loss is whatever the run saw);
// off, the feature is not offered and the rows say so.
func TestQuickDgramRun(t *testing.T) {
	microvm := testenv.Binary(t)
	dir := t.TempDir()
	rowsPath := filepath.Join(dir, "device.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-quick", "-microvm", microvm, "-options", "all-on", "-payloads", "64",
		"-dgram-payloads", "64,4096", "-json", rowsPath, "-runs-json", ""}
	if status := run(args, &stdout, &stderr); status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", status, &stdout, &stderr)
	}
	t.Logf("table:\n%s", &stdout)
	var rows []row
	readJSON(t, rowsPath, &rows)
	n := 0
	for _, r := range rows {
		if r.Kind != "dgram" {
			continue
		}
		n++
		switch r.Options {
		case dgramOn:
			if r.MsgsPerS <= 0 || r.Loss < 0 || r.Loss >= 1 || r.Note != "" {
				t.Errorf("dgram-on row %+v: want datagrams delivered", r)
			}
		case dgramOff:
			if r.Note != "not offered" || r.MsgsPerS != 0 {
				t.Errorf("dgram-off row %+v: want not offered", r)
			}
		default:
			t.Errorf("row %+v: options", r)
		}
	}
	if n != 2*2*2 {
		t.Errorf("%d datagram rows, want 8 (on/off, 2 directions, 2 payloads)", n)
	}
}

// TestProcessSwitches: this process's own counters read, and they grow
// with a read and a sleep.
func TestProcessSwitches(t *testing.T) {
	sys0, sw0, err := processSwitches(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile("/proc/self/stat"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	sys1, sw1, err := processSwitches(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if sys1 <= sys0 || sw1 <= sw0 {
		t.Errorf("syscalls %d -> %d, switches %d -> %d: want both to grow", sys0, sys1, sw0, sw1)
	}
	if got := procFields("syscr: 12\nrchar: x\nvoluntary_ctxt_switches:\t7\n"); got["syscr"] != 12 || got["voluntary_ctxt_switches"] != 7 || len(got) != 2 {
		t.Errorf("procFields: %v", got)
	}
}
