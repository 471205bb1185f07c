// Package ioproto is what the I/O benchmark's host side (bench/iobench) and
// its guest /init (bench/iobench/guest) agree on: the kernel command-line
// parameters that tell the guest what to run, and the lines the guest
// prints on the serial console with what it measured. The console is the
// only channel, so that microvm and QEMU run the guest the same way (no
// agent, no vsock).
package ioproto

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Console lines the guest prints, each at the start of a line.
const (
	// ResultPrefix starts a measurement: the prefix, then a Result as JSON.
	ResultPrefix = "iobench: result "
	// DoneLine ends a guest that ran everything.
	DoneLine = "iobench: done ok"
	// ErrorPrefix ends a guest that failed: the prefix, then why.
	ErrorPrefix = "iobench: error "
)

// Modes of the guest.
const (
	ModeBlk = "blk"
	ModeNet = "net"
)

// Result is one measurement in the guest: Bytes moved (or, for random
// reads, Ops of BlockSize each) in Seconds of guest time.
type Result struct {
	Test      string  `json:"test"`
	BlockSize int     `json:"block_size,omitempty"`
	Ops       int64   `json:"ops"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
}

// Line is the console line for r.
func (r Result) Line() string {
	b, _ := json.Marshal(r) // plain fields: cannot fail
	return ResultPrefix + string(b)
}

// ParseResult parses a console line made by Line. ok is false for any
// other line; err is set for a result line that does not parse.
func ParseResult(line string) (r Result, ok bool, err error) {
	i := strings.Index(line, ResultPrefix)
	if i < 0 {
		return Result{}, false, nil
	}
	// Kernel messages may share the console; the line is taken from the
	// prefix on, and only up to the end of the JSON object.
	s := strings.TrimSpace(line[i+len(ResultPrefix):])
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Result{}, true, fmt.Errorf("ioproto: result line %q: %w", line, err)
	}
	if r.Test == "" || r.Seconds <= 0 {
		return Result{}, true, fmt.Errorf("ioproto: result line %q: no test name or no time", line)
	}
	return r, true, nil
}

// Params is what the host asks the guest to do, passed as iobench.KEY=VALUE
// kernel parameters (the kernel leaves dotted parameters it does not know
// to /proc/cmdline, where the guest reads them).
type Params struct {
	Mode string // ModeBlk or ModeNet
	// Duration is how long each test runs.
	Duration time.Duration
	// Dev is the block device (blk).
	Dev string
	// GuestAddr is the guest's address with prefix length, HostAddr the
	// host's end of the link, Iface the guest's interface (net).
	GuestAddr, HostAddr, Iface string
	// Ports: the guest sends to HostAddr:SendPort and receives from
	// HostAddr:RecvPort (net).
	SendPort, RecvPort int
}

// Cmdline renders p as kernel parameters.
func (p Params) Cmdline() string {
	kv := []string{"mode=" + p.Mode, "seconds=" + strconv.FormatFloat(p.Duration.Seconds(), 'f', -1, 64)}
	if p.Dev != "" {
		kv = append(kv, "dev="+p.Dev)
	}
	if p.GuestAddr != "" {
		kv = append(kv, "guest="+p.GuestAddr, "host="+p.HostAddr, "iface="+p.Iface,
			"send="+strconv.Itoa(p.SendPort), "recv="+strconv.Itoa(p.RecvPort))
	}
	for i := range kv {
		kv[i] = "iobench." + kv[i]
	}
	return strings.Join(kv, " ")
}

// ParseCmdline reads the iobench.* parameters out of a kernel command line
// (the contents of /proc/cmdline).
func ParseCmdline(cmdline string) (Params, error) {
	var p Params
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(k, "iobench.") {
			continue
		}
		var err error
		switch strings.TrimPrefix(k, "iobench.") {
		case "mode":
			p.Mode = v
		case "seconds":
			var s float64
			if s, err = strconv.ParseFloat(v, 64); err == nil && s <= 0 {
				err = fmt.Errorf("not above 0")
			}
			p.Duration = time.Duration(s * float64(time.Second))
		case "dev":
			p.Dev = v
		case "guest":
			p.GuestAddr = v
		case "host":
			p.HostAddr = v
		case "iface":
			p.Iface = v
		case "send":
			p.SendPort, err = strconv.Atoi(v)
		case "recv":
			p.RecvPort, err = strconv.Atoi(v)
		default:
			err = fmt.Errorf("unknown parameter")
		}
		if err != nil {
			return Params{}, fmt.Errorf("ioproto: %s: %w", f, err)
		}
	}
	switch {
	case p.Mode != ModeBlk && p.Mode != ModeNet:
		return Params{}, fmt.Errorf("ioproto: iobench.mode %q: want %s or %s", p.Mode, ModeBlk, ModeNet)
	case p.Duration <= 0:
		return Params{}, fmt.Errorf("ioproto: no iobench.seconds")
	case p.Mode == ModeBlk && p.Dev == "":
		return Params{}, fmt.Errorf("ioproto: no iobench.dev")
	case p.Mode == ModeNet && (p.GuestAddr == "" || p.HostAddr == "" || p.Iface == "" || p.SendPort == 0 || p.RecvPort == 0):
		return Params{}, fmt.Errorf("ioproto: net needs iobench.guest, host, iface, send and recv")
	}
	return p, nil
}
