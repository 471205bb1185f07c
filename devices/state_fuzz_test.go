package devices

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// stateKinds are the devices with a saved state, each with a rig to
// restore into and the accesses that make its "busy" state.
var stateKinds = []struct {
	name    string
	restore func(t *testing.T, data []byte, ops []stateOp) (decoded, accepted bool)
	busy    func(testing.TB) []byte // JSON of a state far from reset
}{
	{"serial", restoreFuzzed(newSerialRig), busyJSON(newSerialRig, serialBusy)},
	{"i8042", restoreFuzzed(newI8042Rig), busyJSON(newI8042Rig, i8042Busy)},
	{"cmos", restoreFuzzed(newCMOSRig), busyJSON(newCMOSRig, cmosBusy)},
	{"ioapic", restoreFuzzed(newIOAPICRig), busyJSON(newIOAPICRig, ioapicBusy)},
	{"portb", restoreFuzzed(newPortBRig), busyJSON(newPortBRig, []stateOp{{1}})},
	{"pvwait", restoreFuzzed(newPVWaitRig), busyJSON(newPVWaitRig, []stateOp{{0}})},
}

func busyJSON[S any](newRig func(testing.TB) stateRig[S], ops []stateOp) func(testing.TB) []byte {
	return func(t testing.TB) []byte {
		r := newRig(t)
		for _, op := range ops {
			r.step(op)
		}
		data, err := json.Marshal(r.save())
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
}

// restoreFuzzed returns a function that decodes data as an S (skipping
// what encoding/json refuses, as internal/snapshot would) and restores it
// into a fresh device, then checks: a refusal wraps ErrBadState and
// changes nothing; an accepted state is what the device then saves; after
// ops, the device's state is still one RestoreState accepts. Nothing may
// panic or block.
func restoreFuzzed[S any](newRig func(testing.TB) stateRig[S]) func(t *testing.T, data []byte, ops []stateOp) (decoded, accepted bool) {
	return func(t *testing.T, data []byte, ops []stateOp) (decoded, accepted bool) {
		t.Helper()
		var st S
		if json.Unmarshal(data, &st) != nil {
			return false, false
		}
		r := newRig(t)
		before := r.save()
		if err := r.restore(st); err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("RestoreState(%+v) = %v, which does not wrap ErrBadState", st, err)
			}
			if diff := cmp.Diff(before, r.save()); diff != "" {
				t.Fatalf("refused RestoreState(%+v) (%v) changed the device (-before +after):\n%s", st, err, diff)
			}
			return true, false
		}
		if diff := cmp.Diff(st, r.save(), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("accepted state and the state saved right after differ (-restored +saved):\n%s", diff)
		}
		for _, op := range ops {
			r.step(op)
		}
		after := r.save()
		if err := newRig(t).restore(after); err != nil {
			t.Fatalf("a device restored from %+v reached %+v, which RestoreState refuses: %v", st, after, err)
		}
		return true, true
	}
}

// opsFrom cuts b into accesses, at most 64.
func opsFrom(b []byte) []stateOp {
	var ops []stateOp
	for len(b) > 0 && len(ops) < 64 {
		var op stateOp
		n := copy(op[:], b)
		b = b[n:]
		ops = append(ops, op)
	}
	return ops
}

// FuzzRestoreState decodes a JSON document as each device's saved state,
// as a corrupt or hostile snapshot would present it, restores it into a
// fresh device and then drives the device with accesses (ops: 8 bytes
// each). See restoreFuzzed for what is checked.
func FuzzRestoreState(f *testing.F) {
	for _, k := range stateKinds {
		f.Add(k.busy(f), []byte{0, 1, 2, 3, 4, 5, 6, 7, 13, 1, 0x80, 0xff, 3, 'a', 'b', 'c'})
	}
	f.Add([]byte(`{"IER":15,"MCR":31,"THRPending":true,"RX":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw=="}`), []byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte(`{"Status":12,"Pending":209,"Out":"////////////////////////"}`), []byte{1, 0, 0xfe, 0})
	f.Add([]byte(`{"RegSel":255,"ID":255,"Redirection":[18446744073709551615,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22]}`), []byte{3, 0, 1, 2, 3, 4})
	f.Add([]byte(`{"Index":255,"NVRAM":null}`), []byte{})
	f.Add([]byte(`{"RX":null,"Out":[],"Redirection":null,"NVRAM":""}`), []byte{})
	f.Fuzz(func(t *testing.T, data, ops []byte) {
		for _, k := range stateKinds {
			k.restore(t, data, opsFrom(ops))
		}
	})
}

// TestRestoreRandomStates restores random states: each device's busy state
// in JSON, with fields replaced by random values of their own JSON type or
// of another, removed, or added. Each device must accept some and (where
// anything is invalid) refuse some, else the test would prove nothing.
func TestRestoreRandomStates(t *testing.T) {
	n := 4000
	if testing.Short() {
		n = 400
	}
	r := rand.New(rand.NewPCG(22, 2))
	type tally struct{ undecodable, refused, accepted int }
	tallies := make([]tally, len(stateKinds))
	bases := make([][]byte, len(stateKinds))
	for i, k := range stateKinds {
		bases[i] = k.busy(t)
	}
	for range n {
		i := r.IntN(len(stateKinds))
		data := mutateJSON(t, r, bases[i])
		ops := randomOps(r, r.IntN(20))
		for j, k := range stateKinds {
			decoded, accepted := k.restore(t, data, ops)
			if j != i {
				continue // decoded as another device's state: must just not panic
			}
			switch {
			case !decoded:
				tallies[i].undecodable++
			case accepted:
				tallies[i].accepted++
			default:
				tallies[i].refused++
			}
		}
	}
	for i, k := range stateKinds {
		c := tallies[i]
		t.Logf("%s: %d accepted, %d refused, %d not JSON of its state", k.name, c.accepted, c.refused, c.undecodable)
		if c.accepted == 0 || (c.refused == 0 && k.name != "portb" && k.name != "pvwait") {
			t.Errorf("%s: %d accepted, %d refused: the random states miss a case", k.name, c.accepted, c.refused)
		}
	}
}

// mutateJSON changes some fields of the JSON object base at random.
func mutateJSON(t *testing.T, r *rand.Rand, base []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(base))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	for k, v := range m {
		switch r.IntN(8) {
		case 0:
			delete(m, k)
		case 1:
			m[k] = randomJSON(r, nil) // any type
		case 2, 3:
			m[k] = randomJSON(r, v) // the same JSON type
		}
	}
	if r.IntN(8) == 0 {
		m["Unknown"] = randomJSON(r, nil)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// randomJSON returns a random JSON value of like's type (a number, a
// base64 string, a list of numbers, a bool), or of any type when like is
// nil.
func randomJSON(r *rand.Rand, like any) any {
	if like == nil {
		like = []any{json.Number("0"), "", []any{}, false, nil}[r.IntN(4)]
	}
	switch v := like.(type) {
	case json.Number:
		return randomNumber(r, v)
	case string:
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil || r.IntN(16) == 0 {
			return []string{"not base64!", "AA", "=", "\u00ff"}[r.IntN(4)]
		}
		lengths := []int{len(b), len(b), len(b) - 1, len(b) + 1, 0, 16, 17, 64, 65, 127, 128, 129, r.IntN(300)}
		n := max(lengths[r.IntN(len(lengths))], 0)
		out := make([]byte, n)
		copy(out, b)
		if r.IntN(2) == 0 {
			for range 1 + r.IntN(3) {
				if n > 0 {
					out[r.IntN(n)] ^= 1 << r.IntN(8)
				}
			}
		}
		return base64.StdEncoding.EncodeToString(out)
	case []any:
		lengths := []int{len(v), len(v), len(v) - 1, len(v) + 1, 0, 23, 24, 25, r.IntN(40)}
		n := max(lengths[r.IntN(len(lengths))], 0)
		out := make([]any, n)
		for i := range out {
			if i < len(v) && r.IntN(4) != 0 {
				out[i] = v[i]
				if num, ok := v[i].(json.Number); ok && r.IntN(3) == 0 {
					if u, err := strconv.ParseUint(string(num), 10, 64); err == nil {
						out[i] = json.Number(strconv.FormatUint(u^1<<r.IntN(64), 10))
					}
				}
			} else {
				out[i] = randomNumber(r, json.Number("0"))
			}
		}
		return out
	case bool:
		return r.IntN(2) == 0
	default:
		return nil
	}
}

// randomNumber returns a number near n, a small one, or one no field holds.
func randomNumber(r *rand.Rand, n json.Number) json.Number {
	switch r.IntN(10) {
	case 0:
		return json.Number([]string{"-1", "256", "1.5", "1e40", "18446744073709551616", "65536"}[r.IntN(6)])
	case 1:
		return json.Number(strconv.FormatUint(r.Uint64(), 10))
	case 2, 3:
		return json.Number(strconv.Itoa(r.IntN(256)))
	case 4, 5:
		return json.Number(strconv.Itoa(r.IntN(16)))
	default:
		if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
			return json.Number(strconv.FormatUint(u^1<<r.IntN(8), 10))
		}
		return n
	}
}
