package agent

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/agentapi"
)

// Info reports what the host provides: uname(2), /proc/uptime and
// /proc/meminfo. A missing source leaves its fields zero.
func (s *Server) Info(context.Context, *agentapi.InfoRequest) (*agentapi.InfoResponse, error) {
	r := &agentapi.InfoResponse{AgentVersion: s.opts.Version, NumCpu: uint32(runtime.NumCPU())}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.KernelRelease = string(bytes.TrimRight(u.Release[:], "\x00"))
	}
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		r.UptimeMs = parseUptime(string(b))
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		m := parseMeminfo(f)
		f.Close()
		r.MemTotalBytes, r.MemFreeBytes, r.MemAvailableBytes = m["MemTotal"], m["MemFree"], m["MemAvailable"]
	}
	return r, nil
}

// parseUptime reads the first field of /proc/uptime ("12.34 56.78"), in
// seconds, as milliseconds; 0 if it does not parse.
func parseUptime(s string) uint64 {
	f, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	v, err := strconv.ParseFloat(f, 64)
	if err != nil || v < 0 {
		return 0
	}
	return uint64(v * 1000)
}

// parseMeminfo returns the fields of /proc/meminfo ("MemTotal:  16 kB") in
// bytes. Lines that do not parse are skipped.
func parseMeminfo(r io.Reader) map[string]uint64 {
	m := make(map[string]uint64)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v <<= 10
		}
		m[key] = v
	}
	return m
}
