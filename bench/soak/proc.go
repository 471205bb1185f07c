package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// usage is a snapshot of one process's resources: what a leak would grow.
type usage struct {
	FDs     int    `json:"fds"`      // entries in /proc/<pid>/fd
	Threads int    `json:"threads"`  // /proc/<pid>/status Threads
	RSS     uint64 `json:"rss"`      // Rss of /proc/<pid>/smaps_rollup (the page tables walked: exact), bytes
	PeakRSS uint64 `json:"peak_rss"` // VmHWM, bytes: the most RSS the process ever had
	VmSize  uint64 `json:"vm_size"`  // VmSize, bytes: every mapping, resident or not
	// Goroutines and HeapAlloc (runtime.MemStats after a GC) are known
	// only for a Go process that measures itself (or reports them, as
	// the device process does); -1 and 0 otherwise.
	Goroutines int    `json:"goroutines"`
	HeapAlloc  uint64 `json:"heap_alloc"`
	// FDKinds counts the descriptors by what they are: "socket",
	// "anon_inode:[eventfd]", a path, ...
	FDKinds map[string]int `json:"fd_kinds,omitempty"`
}

// procUsage reads pid's /proc entries (pid 0: this process, whose
// goroutines and heap it adds after a GC).
func procUsage(pid int) (usage, error) {
	dir := "/proc/self"
	if pid != 0 {
		dir = fmt.Sprintf("/proc/%d", pid)
	}
	u := usage{Goroutines: -1}
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return u, err
	}
	u.FDKinds = map[string]int{}
	for _, e := range ents {
		t, err := os.Readlink(dir + "/fd/" + e.Name())
		if err != nil {
			continue // the directory ReadDir opened to list them, now closed
		}
		if k, _, ok := strings.Cut(t, ":["); ok && (k == "socket" || k == "pipe") {
			t = k // the inode tells nothing here
		}
		u.FDKinds[t]++
		u.FDs++
	}
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return u, err
	}
	if err := parseStatus(st, &u); err != nil {
		return u, fmt.Errorf("%s/status: %w", dir, err)
	}
	// VmRSS is the kernel's running count, which lags by up to a batch
	// of pages per CPU; smaps_rollup walks the page tables.
	if b, err := os.ReadFile(dir + "/smaps_rollup"); err == nil {
		if rss, ok := rollupRSS(b); ok {
			u.RSS = rss
		}
	}
	u.PeakRSS = max(u.PeakRSS, u.RSS)
	if pid == 0 {
		u.Goroutines = runtime.NumGoroutine()
		u.HeapAlloc = heapAfterGC()
	}
	return u, nil
}

// heapAfterGC is the live heap once a collection has run.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// parseStatus fills u's memory and thread fields from a /proc/<pid>/status
// file (proc(5): "VmRSS:\t  1234 kB").
func parseStatus(b []byte, u *usage) error {
	want := map[string]*uint64{"VmRSS": &u.RSS, "VmHWM": &u.PeakRSS, "VmSize": &u.VmSize}
	found := 0
	threads := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if k == "Threads" && len(f) == 1 {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				return fmt.Errorf("status line Threads %q: %w", v, err)
			}
			u.Threads, threads = n, true
			continue
		}
		p := want[k]
		if p == nil {
			continue
		}
		if len(f) != 2 || f[1] != "kB" {
			return fmt.Errorf("%s %q: want <n> kB", k, v)
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return fmt.Errorf("%s %q: %w", k, v, err)
		}
		*p = n << 10
		found++
	}
	if found != len(want) || !threads {
		return fmt.Errorf("want VmRSS, VmHWM, VmSize and Threads")
	}
	return nil
}

// rollupRSS reads the Rss line of a /proc/<pid>/smaps_rollup file.
func rollupRSS(b []byte) (uint64, bool) {
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k != "Rss" {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		return n << 10, err == nil
	}
	return 0, false
}

// settle measures this process until its goroutines are down to at most
// want, or d has passed: goroutines that finish a stop path (a timer, a
// connection's last read) end shortly after what stopped them returned,
// and a leak is what is still there after that.
func settle(want int, d time.Duration) (usage, error) {
	end := time.Now().Add(d)
	for {
		u, err := procUsage(0)
		if err != nil || u.Goroutines <= want || time.Now().After(end) {
			return u, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// raiseNoFile lifts this process's soft RLIMIT_NOFILE to at least want
// descriptors (to the hard limit, which only root can raise), and returns
// the soft limit now in force. Go already raises the soft limit to the
// hard one at start-up; this makes the need explicit and checked.
func raiseNoFile(want uint64) (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur >= want {
		return rl.Cur, nil
	}
	rl.Cur = min(max(want, rl.Cur), rl.Max)
	if want > rl.Max && os.Geteuid() == 0 {
		rl.Cur, rl.Max = want, want
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return rl.Cur, nil
}

// mib formats bytes as MiB with one decimal.
func mib(n uint64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// sizeName formats a byte count the way the flags take it, or in MiB or
// GiB with two decimals when it is not a whole number of either.
func sizeName(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<20) != 0:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20 && n%(1<<10) != 0 || n >= 10<<20 && n%(1<<20) != 0:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// parseSize reads a byte count: a number with an optional K, M, G or T
// suffix (powers of 1024; a trailing "iB" or "B" is allowed).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "i")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k', 'K':
			mult = 1 << 10
		case 'm', 'M':
			mult = 1 << 20
		case 'g', 'G':
			mult = 1 << 30
		case 't', 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix", s)
	}
	return n * mult, nil
}
