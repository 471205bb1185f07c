package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
)

// Datagram rows (experimental vsock datagrams): microvm's
// back-end with datagrams on (--vsock-opt ...,dgram=on) and off (the
// feature is not offered: the rows say so), per direction and payload:
// datagrams delivered per second and the fraction lost. Datagrams have no
// flow control: a sender that outruns the receiver loses datagrams (a full
// host socket queue for g2h, no guest RX buffer for h2g), which is what the
// loss column shows. The guest driver polls its datagram rings.

const (
	dgramOn  = "dgram-on"
	dgramOff = "dgram-off"
)

// dgramSample is one measurement of one pair.
type dgramSample struct {
	options, dir string
	payload      int
	sent, rcvd   uint64
	seconds      float64
	offered      bool
}

// dgramCell measures one direction and payload on a started guest.
func (r *runner) dgramCell(g *vhufront.Guest, be *backendProc, dir string, payload int, port uint32) (dgramSample, error) {
	s := dgramSample{dir: dir, payload: payload, offered: true, seconds: r.dur.Seconds()}
	// How long without a datagram ends a receiver: long enough that a
	// busy host's scheduling does not turn late datagrams into "lost".
	const quiet = 250 * time.Millisecond
	switch dir {
	case g2h:
		sink, err := vhufront.ListenHostDgram(fmt.Sprintf("%s_%d.dgram", be.uds, port), payload)
		if err != nil {
			return s, err
		}
		defer sink.Close()
		if s.sent, err = g.DgramSource(1234, port, payload, r.dur); err != nil {
			return s, err
		}
		// Count until nothing more arrives.
		last, at := uint64(0), time.Now()
		for end := time.Now().Add(r.timeout); ; {
			n, bad := sink.Count()
			if bad > 0 {
				return s, fmt.Errorf("%d datagrams of the wrong size", bad)
			}
			if n != last {
				last, at = n, time.Now()
			} else if time.Since(at) > quiet || n == s.sent {
				s.rcvd = n
				break
			}
			if time.Now().After(end) {
				return s, fmt.Errorf("host sink still counting after %v", r.timeout)
			}
			time.Sleep(time.Millisecond)
		}
	case h2g:
		type res struct {
			n   uint64
			err error
		}
		ch := make(chan res, 1)
		go func() {
			n, err := vhufront.HostDgramSource(be.uds+".dgram", 1234, port, payload, r.dur)
			ch <- res{n, err}
		}()
		got, err := g.DgramSink(payload, time.Now().Add(r.dur), quiet)
		hr := <-ch
		if err != nil {
			return s, err
		}
		if hr.err != nil {
			return s, hr.err
		}
		s.sent, s.rcvd = hr.n, got
	}
	if s.rcvd > s.sent {
		return s, fmt.Errorf("%d datagrams received, %d sent", s.rcvd, s.sent)
	}
	return s, nil
}

// dgramPairs measures every datagram cell on and off, alternating the order
// of the two back-ends per pair.
func (r *runner) dgramPairs(t target, pairs int, payloads, dirs []string) ([]dgramSample, []string) {
	var out []dgramSample
	var fails []string
	for p := range pairs {
		states := []string{dgramOn, dgramOff}
		if p%2 == 1 {
			states[0], states[1] = states[1], states[0]
		}
		for _, st := range states {
			opts := t.vsockOp
			if st == dgramOn {
				opts += ",dgram=on"
			}
			be, err := startBackend(t.argv, t.bin, opts, r.guest.CID, r.timeout)
			if err != nil {
				fails = append(fails, fmt.Sprintf("pair %d %s: %v", p, st, err))
				continue
			}
			cfg := r.guest
			cfg.Dgram = true
			g, err := be.connect(cfg, r.timeout)
			if err != nil {
				_ = be.stop()
				fails = append(fails, fmt.Sprintf("pair %d %s: %v", p, st, err))
				continue
			}
			for _, d := range dirs {
				for _, pl := range payloads {
					var n int
					fmt.Sscan(pl, &n)
					if !g.DgramEnabled() {
						if st == dgramOn {
							fails = append(fails, fmt.Sprintf("pair %d %s: the back-end did not offer datagrams", p, st))
						}
						out = append(out, dgramSample{options: st, dir: d, payload: n})
						continue
					}
					s, err := r.dgramCell(g, be, d, n, r.nextPort())
					if err != nil {
						fails = append(fails, fmt.Sprintf("pair %d %s %s %d B: %v", p, st, d, n, err))
						continue
					}
					s.options = st
					if r.verbose {
						fmt.Fprintf(r.log, "dgram %-9s %s %6d B  %9.0f msgs/s delivered, %d of %d lost\n",
							st, d, n, float64(s.rcvd)/s.seconds, s.sent-s.rcvd, s.sent)
					}
					out = append(out, s)
				}
			}
			if err := g.Close(); err != nil {
				fails = append(fails, fmt.Sprintf("pair %d %s: closing the front-end: %v", p, st, err))
			}
			if err := be.stop(); err != nil {
				fails = append(fails, fmt.Sprintf("pair %d %s: %v", p, st, err))
			}
		}
	}
	return out, fails
}

// dgramRows are the medians over pairs, as device.json rows: msgs_per_s is
// datagrams delivered per second of sending, bytes_per_s their payload,
// loss the fraction of sent datagrams not delivered; off rows carry the
// note "not offered" and zeros.
func dgramRows(samples []dgramSample) []row {
	type key struct {
		options, dir string
		payload      int
	}
	groups := map[key][]dgramSample{}
	var keys []key
	for _, s := range samples {
		k := key{s.options, s.dir, s.payload}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], s)
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.options != b.options {
			return a.options < b.options
		}
		if a.dir != b.dir {
			return a.dir < b.dir
		}
		return a.payload < b.payload
	})
	var out []row
	for _, k := range keys {
		g := groups[k]
		rw := row{Backend: "microvm", Options: k.options, Direction: k.dir, Payload: k.payload, Kind: "dgram"}
		if !g[0].offered {
			rw.Note = "not offered"
			out = append(out, rw)
			continue
		}
		var rate, loss []float64
		for _, s := range g {
			rate = append(rate, float64(s.rcvd)/s.seconds)
			l := 0.0
			if s.sent > 0 {
				l = float64(s.sent-s.rcvd) / float64(s.sent)
			}
			loss = append(loss, l)
		}
		rw.MsgsPerS = median(rate)
		rw.BytesPerS = rw.MsgsPerS * float64(k.payload)
		rw.Loss = median(loss)
		out = append(out, rw)
	}
	return out
}

func printDgramTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "datagrams (experimental; microvm only; guest driver polls its datagram rings): medians")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "options\tdir\tpayload\tmsgs/s\tMB/s\tloss\t")
	for _, r := range rows {
		cols := []string{r.Options, r.Direction, sizeName(r.Payload)}
		if r.Note != "" {
			cols = append(cols, "-", "-", r.Note)
		} else {
			cols = append(cols, fmt.Sprintf("%.0f", r.MsgsPerS), fmt.Sprintf("%.1f", r.BytesPerS/1e6), fmt.Sprintf("%.1f%%", 100*r.Loss))
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	}
	tw.Flush()
}
