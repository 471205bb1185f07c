package main

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// statLine builds a /proc stat line with comm and the given utime, stime
// and guest_time (fields 14, 15, 43); other fields are their index.
func statLine(comm string, utime, stime, guest uint64) string {
	f := []string{"1234", "(" + comm + ")", "R"}
	for n := 4; n <= 52; n++ {
		v := uint64(n)
		switch n {
		case 14:
			v = utime
		case 15:
			v = stime
		case 43:
			v = guest
		}
		f = append(f, strconv.FormatUint(v, 10))
	}
	return strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, line string
		want       threadTimes
		wantErr    bool
	}{
		{"plain", statLine("microvm", 10, 8, 7), threadTimes{10, 8, 7}, false},
		{"comm with spaces and parentheses", statLine("a) b (c", 1, 2, 3), threadTimes{1, 2, 3}, false},
		{"no comm", "1234 microvm R 1 2 3", threadTimes{}, true},
		{"truncated", "1234 (microvm) R 1 2 3 4 5 6 7 8 9 10 11 12 13", threadTimes{}, true},
	}
	for _, tc := range tests {
		got, err := parseStat(tc.line)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err = %v, want error %v", tc.name, err, tc.wantErr)
			continue
		}
		if err == nil && got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestUsagePicksTheVCPUThread(t *testing.T) {
	snap := func(proc threadTimes, th map[string]threadTimes) procSnapshot {
		return procSnapshot{proc: proc, threads: th}
	}
	type result struct {
		VMM, VCPU time.Duration
		TID, How  string
	}
	tests := []struct {
		name string
		a, b procSnapshot
		want result
	}{
		{
			"guest_time grew on one thread; another was busier",
			snap(threadTimes{100, 50, 20}, map[string]threadTimes{"10": {1, 1, 0}, "11": {60, 20, 20}, "12": {5, 5, 0}}),
			snap(threadTimes{200, 80, 30}, map[string]threadTimes{"10": {1, 1, 0}, "11": {80, 25, 30}, "12": {60, 30, 0}}),
			result{1300 * time.Millisecond, 250 * time.Millisecond, "11", "guest_time grew"},
		},
		{
			"no tick of guest time in the window: largest guest_time",
			snap(threadTimes{10, 10, 5}, map[string]threadTimes{"11": {6, 1, 5}, "12": {1, 1, 0}}),
			snap(threadTimes{13, 10, 5}, map[string]threadTimes{"11": {7, 1, 5}, "12": {3, 1, 0}}),
			result{30 * time.Millisecond, 10 * time.Millisecond, "11", "largest guest_time"},
		},
		{
			"no guest time at all: busiest thread, a guess",
			snap(threadTimes{}, map[string]threadTimes{"11": {}, "12": {}}),
			snap(threadTimes{4, 0, 0}, map[string]threadTimes{"11": {1, 0, 0}, "12": {3, 0, 0}}),
			result{40 * time.Millisecond, 30 * time.Millisecond, "12", "guess: busiest thread"},
		},
		{
			"thread started in the window",
			snap(threadTimes{}, map[string]threadTimes{}),
			snap(threadTimes{5, 5, 2}, map[string]threadTimes{"13": {5, 5, 2}}),
			result{100 * time.Millisecond, 100 * time.Millisecond, "13", "guest_time grew"},
		},
	}
	for _, tc := range tests {
		u := usage(tc.a, tc.b)
		got := result{u.VMM, u.VCPU, u.VCPUTID, u.VCPUHow}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestPattern: the table follows docs/testguest.md, and send/receive round
// trip it for every I/O size, detecting a corrupted byte.
func TestPattern(t *testing.T) {
	for _, i := range []int{0, 1, 255, 256, 257, 65535, 65536, 70000, 131071} {
		want := byte((i*7 + (i >> 8)) & 0xff)
		if pattern[i] != want {
			t.Errorf("pattern[%d] = %#x, want %#x", i, pattern[i], want)
		}
		if i < patternPeriod && pattern[i] != pattern[i+patternPeriod] {
			t.Errorf("pattern[%d] != pattern[%d]", i, i+patternPeriod)
		}
	}
	const total = 300_001
	for _, size := range []int{1, 64, 4096, 65536} {
		var buf bytes.Buffer
		writes, err := send(&buf, total, size)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64((total + size - 1) / size); writes != want {
			t.Errorf("size %d: %d writes, want %d", size, writes, want)
		}
		stream := buf.Bytes()
		n, _, err := receive(bytes.NewReader(stream), size, true)
		if err != nil || n != total {
			t.Errorf("size %d: receive = %d, %v; want %d, nil", size, n, err, total)
		}
		stream[123_456] ^= 1
		if _, _, err := receive(bytes.NewReader(stream), size, true); err == nil || !strings.Contains(err.Error(), "mismatch at byte 123456") {
			t.Errorf("size %d: corrupted stream: err = %v, want a mismatch at byte 123456", size, err)
		}
	}
	if _, err := send(io.Discard, 1, maxIO+1); err == nil {
		t.Error("send accepted a write size over 64 KiB")
	}
}

func TestMedian(t *testing.T) {
	s := []unixSample{{rate: rate{Gbps: 3}}, {rate: rate{Gbps: 1}}, {rate: rate{Gbps: 2}}, {rate: rate{Gbps: 9}}}
	if m := median(s, unixSample.gbps); m.Gbps != 2 {
		t.Errorf("median of 4 = %v, want the lower middle 2", m.Gbps)
	}
	if m := median(s[:3], unixSample.gbps); m.Gbps != 2 {
		t.Errorf("median of 3 = %v, want 2", m.Gbps)
	}
	if m := median[unixSample](nil, unixSample.gbps); m != nil {
		t.Errorf("median of none = %v, want nil", m)
	}
}
